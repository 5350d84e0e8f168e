package eventsui

import (
	"fmt"
	"strings"
	"time"

	"github.com/standmeet/events"
)

// The charts are drawn here, on the server, as the path data of an inline
// SVG: the page needs no script and the CSP keeps script-src 'none'.

// Size of a chart's drawing, in SVG user units; the SVG scales to its box.
const (
	chartWidth  = 600
	chartHeight = 120
)

// chart is one chart of a per-minute series.
type chart struct {
	ID, Title, Caption string
	// Line is the series' path data; Area the same, closed along the
	// bottom, to fill.
	Line, Area string
	// Peak is the largest value, labelled; Last the latest minute's.
	Peak, Last string
	// From and To label the time axis.
	From, To string
	// Points is the number of minutes drawn.
	Points int
}

func fannedChart(ms []events.MinuteStats) chart {
	values := make([]float64, len(ms))
	var total int64
	for i, m := range ms {
		values[i] = float64(m.FannedOut)
		total += m.FannedOut
	}
	c := draw("fanned-chart", "Fanned out per minute", ms, values, func(v float64) string { return fmt.Sprintf("%.0f", v) })
	c.Caption = fmt.Sprintf("%d events in all", total)
	return c
}

func lagChart(ms []events.MinuteStats) chart {
	values := make([]float64, len(ms))
	for i, m := range ms {
		values[i] = m.MaxLag.Seconds()
	}
	c := draw("lag-chart", "Lag per minute", ms, values, func(v float64) string {
		return formatLag(time.Duration(v * float64(time.Second)))
	})
	c.Caption = "longest wait from recording to fan-out of the events fanned out each minute"
	return c
}

// draw plots values (one per minute of ms) from the left edge to the right,
// scaled so that the peak touches the top.
func draw(id, title string, ms []events.MinuteStats, values []float64, label func(float64) string) chart {
	c := chart{ID: id, Title: title, Points: len(values)}
	if len(values) == 0 {
		return c
	}
	peak := 0.0
	for _, v := range values {
		peak = max(peak, v)
	}
	c.Peak, c.Last = label(peak), label(values[len(values)-1])
	scale := 1.0
	if peak > 0 {
		scale = chartHeight / peak
	}
	step := 0.0
	if len(values) > 1 {
		step = float64(chartWidth) / float64(len(values)-1)
	}
	var b strings.Builder
	for i, v := range values {
		cmd := 'L'
		if i == 0 {
			cmd = 'M'
		}
		fmt.Fprintf(&b, "%c%.1f,%.1f", cmd, float64(i)*step, chartHeight-v*scale)
	}
	if len(values) == 1 { // one minute: a flat line across
		fmt.Fprintf(&b, "L%d,%.1f", chartWidth, chartHeight-values[0]*scale)
	}
	c.Line = b.String()
	c.Area = fmt.Sprintf("%sL%d,%dL0,%dZ", c.Line, chartWidth, chartHeight, chartHeight)
	c.From = ms[0].Minute.UTC().Format("15:04")
	c.To = ms[len(ms)-1].Minute.UTC().Format("15:04") + " UTC"
	return c
}

// formatLag shows a lag to the millisecond under a second, to the second
// above.
func formatLag(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

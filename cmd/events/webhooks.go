package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events/webhook"
)

// The webhook endpoints, as the web view shows them: state, breaker,
// success rate and latency over the last hour, and an endpoint's attempts.
// An endpoint's URL is printed as its host (and, by inspect, its path):
// never its query, where tokens live; header values and secrets never.

// responseWidth is how much of a receiver's answer an attempts table shows.
const responseWidth = 40

// healthJSON is webhook.EndpointHealth as --json prints it.
type healthJSON struct {
	WindowSeconds       float64    `json:"window_seconds"`
	Attempts            int        `json:"attempts"`
	Successes           int        `json:"successes"`
	SuccessRate         float64    `json:"success_rate"`
	LatencyP50MS        float64    `json:"latency_p50_ms"`
	LatencyP95MS        float64    `json:"latency_p95_ms"`
	LatencyP99MS        float64    `json:"latency_p99_ms"`
	Breaker             string     `json:"breaker"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	OpenUntil           *time.Time `json:"open_until"`
}

// endpointJSON is an endpoint as --json prints it; the fields after Health
// only in inspect.
type endpointJSON struct {
	ID             uuid.UUID  `json:"id"`
	Host           string     `json:"host"`
	Description    string     `json:"description"`
	Types          []string   `json:"types"`
	Scopes         []string   `json:"scopes"`
	Enabled        bool       `json:"enabled"`
	DisabledReason string     `json:"disabled_reason,omitempty"`
	DisabledAt     *time.Time `json:"disabled_at"`
	FailingSince   *time.Time `json:"failing_since"`
	LastSuccessAt  *time.Time `json:"last_success_at"`
	CreatedAt      time.Time  `json:"created_at"`
	Health         healthJSON `json:"health"`

	Path          *string    `json:"path,omitempty"`
	EnabledAt     *time.Time `json:"enabled_at,omitempty"`
	Headers       []string   `json:"headers,omitempty"`        // names only
	SecretHeaders []string   `json:"secret_headers,omitempty"` // names only
	Secrets       *int       `json:"secrets,omitempty"`        // how many sign
	TimeoutMS     *int64     `json:"timeout_ms,omitempty"`
	MaxInFlight   *int       `json:"max_in_flight,omitempty"`
	RateLimit     *float64   `json:"rate_limit,omitempty"`
}

type attemptJSON struct {
	ID         int64     `json:"id"`
	EventID    uuid.UUID `json:"event_id"`
	Attempt    int       `json:"attempt"`
	Status     int       `json:"status"`
	ErrorClass string    `json:"error_class"`
	Error      string    `json:"error"`
	DurationMS float64   `json:"duration_ms"`
	DialedIP   string    `json:"dialed_ip"`
	Response   string    `json:"response"`
	CreatedAt  time.Time `json:"created_at"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func toEndpointJSON(e webhook.Endpoint, h webhook.EndpointHealth) endpointJSON {
	host, _ := hostPath(e.URL)
	return endpointJSON{ID: e.ID, Host: host, Description: e.Description, Types: e.Types, Scopes: e.Scopes, Enabled: e.Enabled,
		DisabledReason: e.DisabledReason, DisabledAt: optTime(e.DisabledAt), FailingSince: optTime(e.FailingSince),
		LastSuccessAt: optTime(e.LastSuccessAt), CreatedAt: e.CreatedAt,
		Health: healthJSON{WindowSeconds: webhook.HealthWindow.Seconds(), Attempts: h.Attempts, Successes: h.Successes,
			SuccessRate: h.SuccessRate, LatencyP50MS: millis(h.LatencyP50), LatencyP95MS: millis(h.LatencyP95),
			LatencyP99MS: millis(h.LatencyP99), Breaker: h.Breaker, ConsecutiveFailures: h.ConsecutiveFailures,
			OpenUntil: optTime(h.OpenUntil)}}
}

// hostPath returns the host (with its port) and the path of an endpoint's
// URL: never its user info, query or fragment.
func hostPath(raw string) (host, path string) {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unreadable URL)", ""
	}
	return u.Host, u.EscapedPath()
}

// webhooks runs "webhooks" (the list) and "webhooks inspect ID".
func (c *cli) webhooks(args []string) error {
	threshold := webhook.BreakerThresholdDefault
	thresholdFlag := func(fs *flag.FlagSet) {
		fs.IntVar(&threshold, "breaker-threshold", webhook.BreakerThresholdDefault, "")
	}
	if len(args) > 0 && args[0] == "inspect" {
		var (
			limit    int
			before   int64
			failures bool
		)
		pos, err := flags("webhooks inspect", args[1:], func(fs *flag.FlagSet) {
			thresholdFlag(fs)
			fs.IntVar(&limit, "limit", 20, "")
			fs.Int64Var(&before, "before", 0, "")
			fs.BoolVar(&failures, "failures", false, "")
		})
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usagef("webhooks inspect: give one endpoint ID")
		}
		id, err := uuid.Parse(pos[0])
		if err != nil {
			return usagef("webhooks inspect: %q is not an endpoint ID", pos[0])
		}
		if limit < 1 || limit > 1000 {
			return usagef("webhooks inspect: --limit takes 1 to 1000")
		}
		wh, err := c.webhookHandle(threshold)
		if err != nil {
			return err
		}
		return c.inspectEndpoint(wh, id, webhook.AttemptFilter{EndpointID: id, FailuresOnly: failures, Before: before, Limit: limit})
	}
	var (
		limit int
		after string
	)
	pos, err := flags("webhooks", args, func(fs *flag.FlagSet) {
		thresholdFlag(fs)
		fs.IntVar(&limit, "limit", 50, "")
		fs.StringVar(&after, "after", "", "")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("webhooks: unexpected %q (the subcommand is inspect)", pos[0])
	}
	if limit < 1 || limit > 1000 {
		return usagef("webhooks: --limit takes 1 to 1000")
	}
	var afterID uuid.UUID
	if after != "" {
		if afterID, err = uuid.Parse(after); err != nil {
			return usagef("webhooks: --after %q is not an endpoint ID", after)
		}
	}
	wh, err := c.webhookHandle(threshold)
	if err != nil {
		return err
	}
	return c.listEndpoints(wh, afterID, limit)
}

// webhookHandle reads the webhook tables; it needs no keys, as it opens no
// secret. threshold is the host's Config.BreakerThreshold, which decides
// the breaker's state.
func (c *cli) webhookHandle(threshold int) (*webhook.Webhooks, error) {
	if threshold < 1 {
		return nil, usagef("webhooks: --breaker-threshold takes a positive number")
	}
	return webhook.New(c.pool, &webhook.Config{Outbox: c.outbox, BreakerThreshold: threshold,
		Logger: slog.New(slog.DiscardHandler)})
}

func (c *cli) listEndpoints(wh *webhook.Webhooks, after uuid.UUID, limit int) error {
	page, err := wh.List(c.ctx, after, limit)
	if err != nil {
		return err
	}
	health := map[uuid.UUID]webhook.EndpointHealth{}
	if len(page.Endpoints) > 0 { // Health of no ID is every endpoint's
		ids := make([]uuid.UUID, len(page.Endpoints))
		for i, e := range page.Endpoints {
			ids[i] = e.ID
		}
		list, err := wh.Health(c.ctx, ids...)
		if err != nil {
			return err
		}
		for _, h := range list {
			health[h.EndpointID] = h
		}
	}
	out := struct {
		Endpoints []endpointJSON `json:"endpoints"`
		Next      *uuid.UUID     `json:"next,omitempty"`
	}{Endpoints: []endpointJSON{}}
	if page.Next != uuid.Nil {
		out.Next = &page.Next
	}
	for _, e := range page.Endpoints {
		out.Endpoints = append(out.Endpoints, toEndpointJSON(e, health[e.ID]))
	}
	return c.output(out, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "ID\tHOST\tSTATE\tBREAKER\tSUCCESS (1H)\tP50\tP95\tTYPES\tSCOPES\tDESCRIPTION\tDISABLED")
		for _, e := range out.Endpoints {
			h := e.Health
			success, p50, p95 := "-", "-", "-"
			if h.Attempts > 0 {
				success = fmt.Sprintf("%s (%d/%d)", percent(h.SuccessRate), h.Successes, h.Attempts)
				p50, p95 = latency(h.LatencyP50MS), latency(h.LatencyP95MS)
			}
			state, disabled := "enabled", "-"
			if !e.Enabled {
				state, disabled = "disabled", cell(e.DisabledReason, errorWidth)
				if e.DisabledAt != nil {
					disabled = e.DisabledAt.UTC().Format(time.RFC3339) + " " + disabled
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, clean(e.Host), state, breaker(h), success, p50, p95,
				clean(strings.Join(e.Types, ",")), scopes(e.Scopes), dash(cell(e.Description, subjectWidth)), disabled)
		}
		if out.Next != nil {
			fmt.Fprintf(w, "\nnext page: --after %s\n", out.Next)
		}
	})
}

func (c *cli) inspectEndpoint(wh *webhook.Webhooks, id uuid.UUID, f webhook.AttemptFilter) error {
	e, err := wh.Get(c.ctx, id)
	if errors.Is(err, webhook.ErrNotFound) {
		return fmt.Errorf("webhook endpoint not found: %s", id)
	}
	if err != nil {
		return err
	}
	var h webhook.EndpointHealth
	if list, err := wh.Health(c.ctx, id); err != nil {
		return err
	} else if len(list) == 1 {
		h = list[0]
	}
	attempts, err := wh.Attempts(c.ctx, f)
	if err != nil {
		return err
	}
	ej := toEndpointJSON(e, h)
	_, path := hostPath(e.URL)
	timeout, secrets := e.Timeout.Milliseconds(), len(e.Secrets)
	ej.Path, ej.EnabledAt, ej.Secrets, ej.TimeoutMS, ej.MaxInFlight, ej.RateLimit = &path, optTime(e.EnabledAt), &secrets,
		&timeout, &e.MaxInFlight, &e.RateLimit
	ej.Headers, ej.SecretHeaders = slices.Sorted(maps.Keys(e.Headers)), slices.Sorted(maps.Keys(e.SecretHeaders))
	out := struct {
		Endpoint endpointJSON  `json:"endpoint"`
		Attempts []attemptJSON `json:"attempts"`
	}{ej, []attemptJSON{}}
	for _, a := range attempts {
		out.Attempts = append(out.Attempts, attemptJSON{a.ID, a.EventID, a.Attempt, a.Status, a.ErrorClass, a.Error,
			millis(a.Duration), a.DialedIP, a.Response, a.CreatedAt})
	}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	return c.output(out, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "id\t%s\nhost\t%s\npath\t%s\n", e.ID, clean(ej.Host), clean(path))
		if e.Description != "" {
			fmt.Fprintf(w, "description\t%s\n", clean(e.Description))
		}
		fmt.Fprintf(w, "types\t%s\nscopes\t%s\n", clean(strings.Join(e.Types, ", ")), scopes(e.Scopes))
		if e.Enabled {
			fmt.Fprintf(w, "state\tenabled\n")
		} else {
			fmt.Fprintf(w, "state\tdisabled since %s: %s\n", stamp(e.DisabledAt), clean(e.DisabledReason))
		}
		if !e.EnabledAt.IsZero() {
			fmt.Fprintf(w, "re-enabled\t%s\n", stamp(e.EnabledAt))
		}
		if !e.FailingSince.IsZero() {
			fmt.Fprintf(w, "failing since\t%s\n", stamp(e.FailingSince))
		}
		last := "never"
		if !e.LastSuccessAt.IsZero() {
			last = stamp(e.LastSuccessAt)
		}
		fmt.Fprintf(w, "last success\t%s\n", last)
		b := fmt.Sprintf("%s, %d consecutive failures", breaker(ej.Health), h.ConsecutiveFailures)
		if !h.OpenUntil.IsZero() {
			b += ", next probe after " + stamp(h.OpenUntil)
		}
		fmt.Fprintf(w, "breaker\t%s\n", b)
		if h.Attempts == 0 {
			fmt.Fprintf(w, "last hour\tno attempts\n")
		} else {
			fmt.Fprintf(w, "last hour\t%d of %d succeeded (%s), p50 %s, p95 %s, p99 %s\n", h.Successes, h.Attempts, percent(h.SuccessRate),
				latency(ej.Health.LatencyP50MS), latency(ej.Health.LatencyP95MS), latency(ej.Health.LatencyP99MS))
		}
		limits := fmt.Sprintf("timeout %s, %d in flight per process", e.Timeout, e.MaxInFlight)
		if e.RateLimit > 0 {
			limits += fmt.Sprintf(", at most %g requests/s", e.RateLimit)
		}
		fmt.Fprintf(w, "limits\t%s\n", limits)
		headers := slices.Clone(ej.Headers)
		for _, name := range ej.SecretHeaders {
			headers = append(headers, name+" (sealed)")
		}
		fmt.Fprintf(w, "headers\t%s\n", dash(clean(strings.Join(headers, ", "))))
		fmt.Fprintf(w, "secrets\t%d\n", secrets)
		fmt.Fprintf(w, "created\t%s\n", stamp(e.CreatedAt))

		fmt.Fprintln(w)
		if len(attempts) == 0 {
			fmt.Fprintln(w, "no attempts")
			return
		}
		fmt.Fprintln(w, "TIME\tEVENT\tTRY\tSTATUS\tCLASS\tDURATION\tDIALED\tERROR\tRESPONSE")
		for _, a := range attempts {
			status := "-"
			if a.Status != 0 {
				status = strconv.Itoa(a.Status)
			}
			class := a.ErrorClass
			if class == "" {
				class = "ok"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", stamp(a.CreatedAt), a.EventID, a.Attempt, status, clean(class),
				latency(millis(a.Duration)), dash(clean(a.DialedIP)), dash(cell(a.Error, errorWidth)), dash(cell(a.Response, responseWidth)))
		}
		if len(attempts) == f.Limit {
			fmt.Fprintf(w, "\nolder: --before %d\n", attempts[len(attempts)-1].ID)
		}
	})
}

func breaker(h healthJSON) string {
	if h.Breaker == "" {
		return "-"
	}
	return h.Breaker
}

func percent(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" }

// latency shows milliseconds as a duration, to the millisecond. The attempt
// log keeps whole milliseconds, so 0 is under one.
func latency(ms float64) string {
	if ms < 1 {
		return "<1ms"
	}
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond).String()
}

func scopes(s []string) string {
	if len(s) == 0 {
		return "(all)"
	}
	return clean(strings.Join(s, ","))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

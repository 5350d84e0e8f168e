package eventsui_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

type searchArgs struct {
	Subject string `json:"subject"`
}

func (searchArgs) Kind() string { return "search.reindex" }

// chromium finds the browser, or fails the test saying how to install it:
// the browser test never skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the browser test needs Chromium: apt-get install chromium (Debian), or put chromium on PATH")
	return ""
}

type auditArgs struct {
	Subject string `json:"subject"`
}

func (auditArgs) Kind() string { return "audit.append" }

type searchWorker struct {
	river.WorkerDefaults[searchArgs]
}

func (searchWorker) Work(context.Context, *river.Job[searchArgs]) error { return nil }

type auditWorker struct {
	river.WorkerDefaults[auditArgs]
}

func (auditWorker) Work(context.Context, *river.Job[auditArgs]) error {
	return errors.New("audit log full")
}

// browser drives one headless Chromium and keeps a screenshot of every page
// it is asked to.
type browser struct {
	t      *testing.T
	ctx    context.Context
	dir    string
	shots  []string
	origin string
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, steps...))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	return s
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(b.t, err)
	require.NoError(b.t, os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644))
	b.shots = append(b.shots, name)
}

// reloadUntil reloads the page until ok says what it shows is right, or
// fails at the deadline with what it last showed.
func (b *browser) reloadUntil(what string, ok func() (bool, string)) {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		done, last := ok()
		if done {
			return
		}
		require.True(b.t, time.Now().Before(deadline), "the page never showed %s (last: %q)", what, last)
		b.do(chromedp.Reload())
	}
}

// In a real browser, as an operator would: the overview's charts render;
// a poisoned event is opened and requeued, and its page then shows each
// subscriber's River job with River's state and error; another is discarded
// after the confirmation page; a filtered set is requeued in bulk after its
// confirmation; the relays page shows this process's relay running, and the
// subscribers page an orphan's warning and Pause and Resume. Every page is screenshotted into the test's temp dir (and
// $EVENTSUI_SCREENSHOTS when set, to look at them).
func TestBrowserOperatorFlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)

	// An hour of history for the charts.
	_, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, created_at, fanned_out_at, fanout)
		SELECT gen_random_uuid(), 'history', f - (g % 7) * interval '1 second', f, '{}'
		  FROM generate_series(1, 1500) g, LATERAL (SELECT now() - (g % 58 + 1) * interval '1 minute' - (g % 13) * interval '1 second' AS f) t
		 WHERE g % 58 < 40 OR g % 3 = 0`)
	require.NoError(t, err)

	var fixed atomic.Bool
	relay, err := events.NewRelay(pool, &events.RelayConfig{MaxAttempts: 1, Listener: events.ListenerConfig{PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "search", Types: []string{"**"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			if !fixed.Load() {
				return nil, nil, errors.New("search index is read-only")
			}
			return searchArgs{Subject: e.Subject}, nil, nil
		}}))
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "audit", Types: []string{"note.*"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return auditArgs{Subject: e.Subject}, &river.InsertOpts{MaxAttempts: 1}, nil
		}}))
	workers := river.NewWorkers()
	river.AddWorker(workers, &searchWorker{})
	river.AddWorker(workers, &auditWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer client.Stop(ctx)
	require.NoError(t, relay.Start(ctx, client))
	defer relay.Stop(ctx)

	// Four poisoned events: one to requeue, one to discard, two ledger
	// entries to requeue in bulk.
	var requeued, discarded, ledger1, ledger2 events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		es, err := events.RecordMany(ctx, tx, []events.Event{
			{Type: "note.changed", Subject: "note:7", Payload: []byte(`{"title":"Plan"}`)},
			{Type: "note.deleted", Subject: "note:<b>8</b>"},
			{Type: "ledger.entry", Subject: "entry:1"},
			{Type: "ledger.entry", Subject: "entry:2"},
		})
		if err == nil {
			requeued, discarded, ledger1, ledger2 = es[0], es[1], es[2], es[3]
		}
		return err
	}))
	poisoned := func(e events.Event) bool {
		info, err := outbox.Inspect(ctx, pool, e.ID)
		return err == nil && info.Poisoned()
	}
	require.Eventually(t, func() bool {
		return poisoned(requeued) && poisoned(discarded) && poisoned(ledger1) && poisoned(ledger2)
	}, 10*time.Second, 10*time.Millisecond)
	fixed.Store(true)

	ui, err := eventsui.NewHandler(pool, &eventsui.Config{Prefix: "/outbox", RiverUIURL: "/riverui",
		Authorize: func(*http.Request, eventsui.Action) bool { return true }})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", ui)
	srv := httptest.NewServer(mux) // loopback only
	defer srv.Close()

	b := newBrowser(ctx, t, srv.URL)
	bctx := b.ctx

	// The overview: four poisoned, and both charts drawn.
	b.do(chromedp.Navigate(srv.URL + "/outbox/"))
	require.Equal(t, "4", b.text("#poisoned"))
	for _, chart := range []string{"#fanned-chart", "#lag-chart"} {
		d, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS(chart+" path.line"), "d"))
		require.NoError(t, err)
		require.True(t, d.Exists && strings.HasPrefix(d.Value, "M") && strings.Count(d.Value, "L") >= 60, "%s: %q", chart, d.Value)
		box, err := chromedp.Run(bctx, chromedp.Dimensions(chromedp.CSS(chart+" svg")))
		require.NoError(t, err)
		require.Greater(t, box.Width, int64(300), chart+" is laid out")
		require.Greater(t, box.Height, int64(100), chart+" is laid out")
	}
	b.screenshot("overview")

	// The poisoned list: when each was poisoned; IDs on one line.
	b.do(chromedp.Click(chromedp.CSS(`a.card[href$="state=poisoned"]`)), chromedp.WaitVisible(chromedp.CSS("td.poisoned-at")))
	style, err := chromedp.Run(bctx, chromedp.ComputedStyle(chromedp.CSS("td.id")))
	require.NoError(t, err)
	computed := map[string]string{}
	for _, p := range style {
		computed[p.Name] = p.Value
	}
	// white-space: nowrap, or its longhand in newer Chromium.
	require.Contains(t, []string{computed["white-space"], computed["text-wrap-mode"]}, "nowrap", "IDs do not wrap")
	b.screenshot("poisoned")

	// Requeue one; once fanned out, its page shows each job as River has it.
	b.do(chromedp.Click(chromedp.CSS(`a[href="/outbox/events/`+requeued.ID.String()+`"]`)), chromedp.WaitVisible(chromedp.ID("requeue")))
	// Per subscriber: delivered to audit, poisoned for search, with the
	// error history and the pair's own buttons.
	require.Equal(t, "delivered", b.text(`#deliveries tr[data-subscriber="audit"] .delivery-state`))
	require.Equal(t, "poisoned", b.text(`#deliveries tr[data-subscriber="search"] .delivery-state`))
	require.Contains(t, b.text(`table.history[data-subscriber="search"]`), "search index is read-only")
	b.do(chromedp.WaitVisible(chromedp.CSS(`#deliveries tr[data-subscriber="search"] button.pair-requeue`)))
	b.screenshot("event-poisoned")
	b.do(chromedp.Click(chromedp.ID("requeue")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	b.reloadUntil("each job's final state", func() (bool, string) {
		rows, err := chromedp.Run(bctx, chromedp.Nodes(chromedp.CSSAll("#jobs tbody tr"), chromedp.AtLeast(0)))
		require.NoError(t, err)
		if len(rows) < 2 {
			info, _ := outbox.Inspect(ctx, pool, requeued.ID)
			return false, fmt.Sprintf("%s, %d rows, fanout %v", b.text("#state"), len(rows), info.Fanout)
		}
		search, audit := b.text(`#jobs tr[data-subscriber="search"] .job-state`), b.text(`#jobs tr[data-subscriber="audit"] .job-state`)
		return search == "completed" && audit == "discarded", search + ", " + audit
	})
	require.Equal(t, "fanned out", b.text("#state"))
	require.Contains(t, b.text(`#jobs tr[data-subscriber="audit"]`), "audit log full", "River's last error of the job")
	require.Contains(t, b.text(`#jobs tr[data-subscriber="audit"]`), "1 / 1")
	// Delivered to both now.
	require.Equal(t, "delivered", b.text(`#deliveries tr[data-subscriber="search"] .delivery-state`))
	b.screenshot("event-jobs")

	// Discard another, through its confirmation page.
	b.do(chromedp.Navigate(srv.URL+"/outbox/events/"+discarded.ID.String()), chromedp.Click(chromedp.ID("discard")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "Discard this poisoned event for good?", b.text("#question"))
	require.True(t, poisoned(discarded), "nothing happens before the confirmation")
	b.screenshot("confirm-discard")
	b.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Contains(t, b.text(".flash"), "discarded")
	// Its poisoned delivery is dropped; the row (fanned out to nobody else)
	// stays for retention.
	info, err := outbox.Inspect(ctx, pool, discarded.ID)
	require.NoError(t, err)
	require.False(t, info.Poisoned())
	require.Empty(t, info.Deliveries)

	// Requeue the ledger entries in bulk: filter, confirm the count, confirm.
	b.do(chromedp.SendKeys(chromedp.CSS(`form.filters input[name="type"]`), "ledger.*"),
		// The unfiltered page has a bulk-requeue link too: wait for the
		// filtered one.
		chromedp.Click(chromedp.CSS("form.filters button")), chromedp.WaitVisible(chromedp.CSS(`#bulk-requeue[href*="type=ledger"]`)))
	b.screenshot("poisoned-filtered")
	b.do(chromedp.Click(chromedp.ID("bulk-requeue")), chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "Requeue 2 poisoned events of type ledger.*?", b.text("#question"))
	require.True(t, poisoned(ledger1) && poisoned(ledger2), "nothing happens before the confirmation")
	b.screenshot("confirm-bulk-requeue")
	b.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Equal(t, "2 events requeued.", b.text(".flash"))
	b.screenshot("poisoned-after-bulk")
	require.Eventually(t, func() bool {
		a, err1 := outbox.Inspect(ctx, pool, ledger1.ID)
		c, err2 := outbox.Inspect(ctx, pool, ledger2.ID)
		return err1 == nil && err2 == nil && len(a.Fanout) > 0 && len(c.Fanout) > 0 && len(a.Deliveries)+len(c.Deliveries) == 0
	}, 20*time.Second, 20*time.Millisecond, "the relay delivers the requeued entries")

	// The relays page, from the nav: this process's relay, running.
	b.do(chromedp.Click(chromedp.ID("nav-relays")), chromedp.WaitVisible(chromedp.ID("relays")))
	host, err := os.Hostname()
	require.NoError(t, err)
	// Its first report comes before it listens; the next ones (every 5 s)
	// say it listens and when it last fanned out.
	b.reloadUntil("this process's relay running and listening", func() (bool, string) {
		text := b.text("#relays tbody")
		return strings.Contains(text, host) && strings.Contains(text, fmt.Sprintf("pid %d", os.Getpid())) &&
			b.text("#relays tbody .relay-state") == "running" && b.text("#relays tbody .mode") == "listening" &&
			!strings.Contains(text, "never"), text
	})
	require.Contains(t, b.text("#relays tbody .subscribers"), "search")
	require.Contains(t, b.text("#relays tbody .subscribers"), "audit")
	b.screenshot("relays")

	// The subscribers page: a subscriber no relay serves any more is
	// orphaned, with the fix named; pause and resume audit with a click.
	_, err = pool.Exec(ctx, `INSERT INTO outbox_subscribers (name, registered_at, types, last_served_at)
		VALUES ('ghost', now() - interval '1 day', '{ledger.*}', now() - interval '1 hour')`)
	require.NoError(t, err)
	b.do(chromedp.Click(chromedp.ID("nav-subscribers")), chromedp.WaitVisible(chromedp.ID("subscribers")))
	require.Contains(t, b.text(`.warning.orphan[data-subscriber="ghost"]`), "Deploy a release that has it, or retire it")
	require.Equal(t, "orphaned", b.text(`tr[data-subscriber="ghost"] .sub-state`))
	require.Contains(t, b.text(`tr[data-subscriber="search"] .served-by`), host)
	b.do(chromedp.Click(chromedp.CSS(`tr[data-subscriber="audit"] button.pause`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-subscriber="audit"] button.resume`)))
	require.Equal(t, "Subscriber audit paused.", b.text(".flash"))
	require.Equal(t, "paused", b.text(`tr[data-subscriber="audit"] .sub-state`))
	b.screenshot("subscribers")
	// The page after the post has the pause button again (the flash is on
	// both pages, so it cannot tell them apart).
	b.do(chromedp.Click(chromedp.CSS(`tr[data-subscriber="audit"] button.resume`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-subscriber="audit"] button.pause`)))
	require.Equal(t, "Subscriber audit resumed.", b.text(".flash"))
	require.Equal(t, "active", b.text(`tr[data-subscriber="audit"] .sub-state`))

	b.do(chromedp.Navigate(srv.URL + "/outbox/?range=24h"))
	b.screenshot("overview-24h")
}

// newBrowser starts a headless Chromium (flags for a machine without a
// network beyond loopback) for a page served at origin. Its screenshots are
// written to a temporary directory and, when EVENTSUI_SCREENSHOTS names a
// directory, kept there when t ends.
func newBrowser(ctx context.Context, t *testing.T, origin string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	bctx, cancelTimeout := context.WithTimeout(bctx, 120*time.Second)
	b := &browser{t: t, ctx: bctx, dir: t.TempDir(), origin: origin}
	t.Cleanup(func() {
		cancelTimeout()
		cancelBrowser()
		cancelAlloc()
		t.Logf("screenshots in %s: %v", b.dir, b.shots)
		if out := os.Getenv("EVENTSUI_SCREENSHOTS"); out != "" {
			for _, name := range b.shots {
				png, err := os.ReadFile(filepath.Join(b.dir, name+".png"))
				if err == nil {
					err = os.WriteFile(filepath.Join(out, name+".png"), png, 0o644)
				}
				if err != nil {
					t.Errorf("keeping screenshot %s: %v", name, err)
				}
			}
		}
	})
	return b
}

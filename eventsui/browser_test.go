package eventsui_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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

// In a real browser: the overview shows a poisoned event, the operator opens
// it, clicks Requeue, and sees it fanned out once the relay has taken it.
// Screenshots of the overview and the detail page go to the test's temp dir.
func TestBrowserRequeuesAPoisonedEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)

	var fixed atomic.Bool
	relay, err := events.NewRelay(pool, &events.Config{MaxAttempts: 1, Listener: events.ListenerConfig{PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "search", Types: []string{"**"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			if !fixed.Load() {
				return nil, nil, errors.New("search index is read-only")
			}
			return searchArgs{Subject: e.Subject}, nil, nil
		}}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, client))
	defer relay.Stop(ctx)
	var e events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		e, err = events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:7", Payload: []byte(`{"title":"Plan"}`)})
		return err
	}))
	require.Eventually(t, func() bool {
		info, err := events.Inspect(ctx, pool, e.ID)
		return err == nil && info.Poisoned()
	}, 10*time.Second, 10*time.Millisecond)
	fixed.Store(true)

	ui, err := eventsui.NewHandler(pool, &eventsui.Options{Prefix: "/outbox", Authorize: func(*http.Request, eventsui.Action) bool { return true }})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", ui)
	srv := httptest.NewServer(mux) // loopback only
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	defer cancelTimeout()

	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/outbox/")))
	poisoned, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("poisoned")))
	require.NoError(t, err)
	require.Equal(t, "1", poisoned)
	overview, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`a.card[href$="state=poisoned"]`)),
		chromedp.Click(chromedp.CSS(`a[href="/outbox/events/`+e.ID.String()+`"]`)),
		chromedp.WaitVisible(chromedp.ID("requeue")),
	))
	detail, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("requeue")), chromedp.WaitVisible(chromedp.CSS(".flash"))))
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "overview.png"), overview, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "detail.png"), detail, 0o644))
	t.Logf("screenshots: %s", dir)
	if out := os.Getenv("EVENTSUI_SCREENSHOTS"); out != "" { // to look at them
		_ = os.WriteFile(filepath.Join(out, "overview.png"), overview, 0o644)
		_ = os.WriteFile(filepath.Join(out, "detail.png"), detail, 0o644)
	}

	// The relay fans the requeued event out; the page says so on reload.
	deadline := time.Now().Add(20 * time.Second)
	var state string
	for state != "fanned out" {
		require.True(t, time.Now().Before(deadline), "the page never showed the event fanned out (last: %q)", state)
		require.NoError(t, chromedp.Do(bctx, chromedp.Reload()))
		state, err = chromedp.Run(bctx, chromedp.Text(chromedp.ID("state")))
		require.NoError(t, err)
	}
	info, err := events.Inspect(ctx, pool, e.ID)
	require.NoError(t, err)
	require.Contains(t, info.Fanout, "search")
}

package eventsui_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

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

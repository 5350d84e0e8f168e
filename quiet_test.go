package events

import (
	"io"
	"log/slog"
	"os"
)

// quietLogger keeps River's and the relay's logs out of test output unless
// EVENTS_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("EVENTS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

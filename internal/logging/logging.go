// Package logging holds the one logger default of every package of the
// library, so that a component left without a Logger logs the same way as
// every other.
package logging

import (
	"log/slog"
	"os"
)

// Default is the logger of a component whose config leaves Logger nil:
// warnings and errors, as text on standard error. Debug and info logs are
// what a host opts into by giving its own logger.
func Default() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

//go:build race

package events

// raceEnabled is true under the race detector, which slows everything
// several times: timing bounds of tests scale with it.
const raceEnabled = true

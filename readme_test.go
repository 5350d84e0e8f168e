package events

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// README.md's usage snippet is example_test.go's Example, which runs: keep
// them the same so the README never shows code that does not compile.
func TestReadmeUsageIsTheRunnableExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)

	_, usage, ok := strings.Cut(string(readme), "## Usage")
	require.True(t, ok, "README.md has no Usage section")
	_, block, ok := strings.Cut(usage, "```go\n")
	require.True(t, ok, "README.md's Usage section has no Go block")
	block, _, _ = strings.Cut(block, "```")

	var exampleLines []string
	for _, l := range strings.Split(string(example), "\n") {
		exampleLines = append(exampleLines, strings.TrimSpace(l))
	}
	next := 0
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		found := false
		for next < len(exampleLines) {
			next++
			if exampleLines[next-1] == l {
				found = true
				break
			}
		}
		require.True(t, found, "README.md usage line not in example_test.go (in order): %q", l)
	}
}

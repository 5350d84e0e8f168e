package events

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every "events.Name" in the module's documentation (Go comments and
// Markdown, the CHANGELOG aside: it names what was removed) is an exported
// name of this package: the docs name no function the API lost.
func TestDocsNameNoRemovedIdentifier(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	exported := map[string]bool{} // "Name", and "Type.Method"/"Type.Field"
	for _, f := range files {
		for name, obj := range f.Scope.Objects {
			if !ast.IsExported(name) || obj == nil {
				continue
			}
			exported[name] = true
			if ts, ok := obj.Decl.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							exported[name+"."+n.Name] = true
						}
					}
				}
			}
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && ast.IsExported(fd.Name.Name) {
				recv := fd.Recv.List[0].Type
				if se, ok := recv.(*ast.StarExpr); ok {
					recv = se.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					exported[id.Name+"."+fd.Name.Name] = true
				}
			}
		}
	}
	ref := regexp.MustCompile(`\bevents\.([A-Z][A-Za-z0-9]*)(\.[A-Z][A-Za-z0-9]*)?`)
	docLink := regexp.MustCompile(`\[([A-Z][A-Za-z0-9]*)(\.[A-Z][A-Za-z0-9]*)?\]`)
	var stale []string
	check := func(path, text string) {
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			if !exported[m[1]] {
				stale = append(stale, path+": events."+m[1])
				continue
			}
			// events.Type.Member, when Type is a type with members.
			if m[2] != "" && hasMembers(exported, m[1]) && !exported[m[1]+m[2]] {
				stale = append(stale, path+": events."+m[1]+m[2])
			}
		}
	}
	require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		switch {
		case strings.HasSuffix(path, ".md") && filepath.Base(path) != "CHANGELOG.md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			check(path, string(b))
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			for _, c := range f.Comments {
				check(path, c.Text())
				if filepath.Dir(path) == "." {
					// The package's own doc links: [Name], [Type.Member].
					for _, m := range docLink.FindAllStringSubmatch(c.Text(), -1) {
						if !exported[m[1]] || (m[2] != "" && !exported[m[1]+m[2]]) {
							stale = append(stale, path+": ["+m[1]+m[2]+"]")
						}
					}
				}
			}
		}
		return nil
	}))
	require.Empty(t, stale, "documentation naming identifiers package events no longer has")
}

func hasMembers(exported map[string]bool, typ string) bool {
	for k := range exported {
		if strings.HasPrefix(k, typ+".") {
			return true
		}
	}
	return false
}

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

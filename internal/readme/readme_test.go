// Package readme checks the Go code of the repository's README.md: every ```go block, pasted
// into one package, compiles, and names each package it imports the same way everywhere.
package readme_test

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	line int // of the opening fence
	code string
}

// goSnippets returns the ```go blocks of the Markdown file at path, their indentation (inside a
// list item, say) removed.
func goSnippets(t *testing.T, path string) []snippet {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var (
		out    []snippet
		cur    *snippet
		indent string
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```go":
			cur, indent = &snippet{line: n}, line[:strings.Index(line, "```")]
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a ```go block that does not end", path)
	return out
}

// TestREADMESnippets writes the Go blocks of README.md as the files of one package under
// testdata and runs go vet on it: every import is named, every error is used, and the blocks
// fit together as a user pasting them would put them.
func TestREADMESnippets(t *testing.T) {
	t.Parallel()
	snippets := goSnippets(t, filepath.Join("..", "..", "README.md"))
	require.NotEmpty(t, snippets)

	aliases := map[string]string{} // import path → name, across every block
	where := map[string]int{}
	fset := token.NewFileSet()
	require.NoError(t, os.MkdirAll("testdata", 0o755))
	dir, err := os.MkdirTemp("testdata", "snippets-")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove("testdata") // unless another run still uses it
	})
	for i, s := range snippets {
		src := fmt.Sprintf("// README.md line %d.\n\npackage snippets\n\n%s", s.line, s.code)
		f, err := parser.ParseFile(fset, fmt.Sprintf("README.md:%d", s.line), src, parser.ImportsOnly)
		require.NoError(t, err, "README.md line %d", s.line)
		require.NotEmpty(t, f.Imports, "README.md line %d: the block names its imports", s.line)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if prev, ok := aliases[path]; ok {
				require.Equal(t, prev, name, "README.md line %d imports %s as %s, line %d as %s: use one name per package",
					s.line, path, name, where[path], prev)
				continue
			}
			aliases[path], where[path] = name, s.line
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("snippet%02d.go", i)), []byte(src), 0o644))
	}
	names := map[string]string{} // name → import path
	for path, name := range aliases {
		if prev, ok := names[name]; ok && prev != path {
			t.Errorf("README.md names two packages %s: %s (line %d) and %s (line %d)", name, prev, where[prev], path, where[path])
		}
		names[name] = path
	}

	goTool, err := exec.LookPath("go")
	require.NoError(t, err)
	out, err := exec.Command(goTool, "vet", "./"+filepath.ToSlash(dir)).CombinedOutput()
	require.NoError(t, err, "the Go blocks of README.md do not compile (each file's first line names its block's line):\n%s", out)
}

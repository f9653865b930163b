package readme_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// packageClause finds a block that is a whole file (its own package clause) and its package.
var packageClause = regexp.MustCompile(`(?m)^package (\w+)`)

// testFunc finds a block that is a test file: it declares a test, benchmark, fuzz test or
// example.
var testFunc = regexp.MustCompile(`(?m)^func (Test|Benchmark|Fuzz|Example)\w*\(`)

// dirName turns a Markdown path into a directory name: docs/guides/x.md → docs_guides_x.
func dirName(path string) string {
	return strings.NewReplacer("/", "_", ".md", "", "-", "_", ".", "_").Replace(path)
}

// TestGoBlocks writes the Go blocks of README.md and of every docs/**/*.md as packages under
// testdata and runs go vet on them: every import is named, every error is used, and the blocks
// fit together as a user pasting them would put them. The blocks of one file without a
// package clause are the files of one package (each file's its own); the blocks of one file
// with the same package clause are the files of another (a program and its test, as a user
// saves them side by side). A block that declares a test is a _test.go file.
func TestGoBlocks(t *testing.T) {
	t.Parallel()
	require.NoError(t, os.MkdirAll("testdata", 0o755))
	dir, err := os.MkdirTemp("testdata", "snippets-")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove("testdata") // unless another run still uses it
	})
	total := 0
	for _, file := range markdownFiles(t) {
		var pasted []block
		var names []string            // the package clauses of whole-file blocks, in order
		whole := map[string][]block{} // package name → its whole-file blocks
		for _, b := range parseMarkdown(t, file).blocks {
			if b.lang != "go" {
				continue
			}
			total++
			if m := packageClause.FindStringSubmatch(b.code); m != nil {
				if _, ok := whole[m[1]]; !ok {
					names = append(names, m[1])
				}
				whole[m[1]] = append(whole[m[1]], b)
				continue
			}
			pasted = append(pasted, b)
		}
		if len(pasted) > 0 {
			writeBlocks(t, filepath.Join(dir, dirName(file)), file, pasted, true)
		}
		for _, name := range names {
			writeBlocks(t, filepath.Join(dir, dirName(file)+"_package_"+name), file, whole[name], false)
		}
	}
	require.NotZero(t, total, "no Go blocks found in README.md or docs/")

	goTool, err := exec.LookPath("go")
	require.NoError(t, err)
	out, err := exec.Command(goTool, "vet", "./"+filepath.ToSlash(dir)+"/...").CombinedOutput()
	require.NoError(t, err, "Go blocks do not compile (each file's first line names its Markdown file and line):\n%s", out)
}

// writeBlocks writes blocks of the Markdown file as the files of one package in dir;
// addPackage puts a package clause before each, and checks that every block names its
// imports, one name per package across the blocks.
func writeBlocks(t *testing.T, dir, file string, blocks []block, addPackage bool) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	aliases := map[string]string{} // import path → name, across the blocks
	where := map[string]int{}
	fset := token.NewFileSet()
	for i, b := range blocks {
		src := fmt.Sprintf("// %s line %d.\n\n", file, b.line)
		if addPackage {
			src += "package snippets\n\n"
		}
		src += b.code
		f, err := parser.ParseFile(fset, fmt.Sprintf("%s:%d", file, b.line), src, parser.ImportsOnly)
		require.NoError(t, err, "%s line %d", file, b.line)
		if addPackage {
			require.NotEmpty(t, f.Imports, "%s line %d: the block names its imports", file, b.line)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if prev, ok := aliases[path]; ok {
				require.Equal(t, prev, name, "%s line %d imports %s as %s, line %d as %s: use one name per package",
					file, b.line, path, name, where[path], prev)
				continue
			}
			aliases[path], where[path] = name, b.line
		}
		name := fmt.Sprintf("snippet%02d.go", i)
		if testFunc.MatchString(b.code) {
			name = fmt.Sprintf("snippet%02d_test.go", i)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	names := map[string]string{} // name → import path
	for path, name := range aliases {
		if prev, ok := names[name]; ok && prev != path {
			t.Errorf("%s names two packages %s: %s (line %d) and %s (line %d)", file, name, prev, where[prev], path, where[path])
		}
		names[name] = path
	}
}

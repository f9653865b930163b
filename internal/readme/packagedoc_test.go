package readme_test

import (
	"os/exec"
	"path"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// TestPackageDocs: the go doc of every package of the module opens with a sentence that a
// newcomer can start from: "Package <name> …" (a command: "<Name> …" or "Command <name> …"),
// at least six words, ending with a period.
func TestPackageDocs(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Name}}\t{{.Doc}}", root+"/...").CombinedOutput()
	require.NoError(t, err, "go list:\n%s", out)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.SplitN(line, "\t", 3)
		require.Len(t, fields, 3, line)
		n++
		if problem := packageDocProblem(fields[0], fields[1], fields[2]); problem != "" {
			t.Errorf("%s: %s", fields[0], problem)
		}
	}
	require.Greater(t, n, 10, "go list found few packages")
}

// packageDocProblem says what is wrong with a package's synopsis (its doc's first sentence),
// or "".
func packageDocProblem(importPath, name, synopsis string) string {
	if synopsis == "" {
		return "no package comment: add one (doc.go) that starts \"Package " + name + "\""
	}
	var openings []string
	if name == "main" {
		base := path.Base(importPath)
		openings = []string{"Command " + base + " ", string(unicode.ToUpper(rune(base[0]))) + base[1:] + " "}
	} else {
		openings = []string{"Package " + name + " "}
	}
	opens := false
	for _, o := range openings {
		opens = opens || strings.HasPrefix(synopsis, o)
	}
	switch {
	case !opens:
		return "the package comment starts " + quoteStart(synopsis) + ", not " + strings.Join(openings, "or ")
	case len(strings.Fields(synopsis)) < 6:
		return "the package comment's first sentence is too short to tell a newcomer anything: " + synopsis
	case !strings.HasSuffix(synopsis, "."):
		return "the package comment's first sentence does not end with a period: " + synopsis
	}
	return ""
}

func quoteStart(s string) string {
	if f := strings.Fields(s); len(f) > 2 {
		s = strings.Join(f[:2], " ") + " …"
	}
	return "\"" + s + "\""
}

func TestPackageDocProblem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ path, name, doc, want string }{
		{"x/worker", "worker", "Package worker runs projections on a Watermill router.", ""},
		{"x/cmd/nudge", "main", "Command nudge is the operator's tool for a deployment.", ""},
		{"x/examples/quickstart", "main", "Quickstart shows nudge healing a projection, with no servers.", ""},
		{"x/worker", "worker", "", "no package comment"},
		{"x/worker", "worker", "Worker runs projections on a router.", "starts"},
		{"x/worker", "worker", "Package worker is it.", "too short"},
		{"x/worker", "worker", "Package worker runs projections on a router", "period"},
	} {
		got := packageDocProblem(c.path, c.name, c.doc)
		if c.want == "" {
			require.Empty(t, got, c.doc)
		} else {
			require.Contains(t, got, c.want, c.doc)
		}
	}
}

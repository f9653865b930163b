package nudgetest_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// goBlock matches a Go code block of a markdown file.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestGuideCompiles: every Go block of docs/guides/testing.md is a complete file that
// compiles (each is vetted as a package of its own).
func TestGuideCompiles(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile(filepath.Join("..", "docs", "guides", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllSubmatch(guide, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/guides/testing.md has no Go block")
	}
	// Inside the module, so the blocks import it; testdata keeps them out of ./... patterns.
	dir, err := os.MkdirTemp(".", "testdata-guide-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var pkgs []string
	for i, b := range blocks {
		pkg := filepath.Join(dir, "testdata", fmt.Sprintf("block%d", i+1))
		if err := os.MkdirAll(pkg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, "guide_test.go"), b[1], 0o600); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, "./"+pkg)
	}
	out, err := exec.Command("go", append([]string{"vet"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("the Go blocks of docs/guides/testing.md (block N is the Nth) do not compile: %v\n%s", err, out)
	}
}

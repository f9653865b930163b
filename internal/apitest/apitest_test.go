package apitest_test

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nudgeworks/nudge/internal/apitest"
)

// TestNoExportedMutableGlobals: the only exported variables of the module's public packages
// (internal ones are no API) are error sentinels (Err…): a default, a bucket list or a special value is a constant or a function
// returning a fresh value, so no user can change it for everyone.
func TestNoExportedMutableGlobals(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	var dirs int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "internal") {
			return filepath.SkipDir
		}
		dirs++
		for _, v := range apitest.Vars(t, path) {
			if !strings.HasPrefix(v, "Err") {
				t.Errorf("%s: exported variable %s (make it a constant or a function)", path, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if dirs < 20 {
		t.Fatalf("walked %d directories from %s: the module's packages were not found", dirs, root)
	}
}

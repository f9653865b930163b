// Package layers checks the module's import graph against the layers it is built in (Rules):
// the vocabulary every part shares (eventstore, name, trigger) is a leaf, and the channels, the
// dead-letter store and the retry policy depend neither on the runner nor on pgx unless they are
// PostgreSQL ones, so an in-process user of channel/gochannel does not pull in a database driver.
// Its test runs Check on the graph `go list -deps` reports.
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
)

// Module is the import path of the module the rules are about.
const Module = "github.com/nudgeworks/nudge"

// Rule says what one package of the module may depend on, directly or through others. Test
// files are not part of the graph: a test may import anything.
type Rule struct {
	// Package is the package's path inside the module ("channel/gochannel"; "" is the root).
	Package string
	// Leaf limits the module packages Package may depend on to those in Allow.
	Leaf bool
	// Allow lists the module packages (paths inside the module) a Leaf may depend on.
	Allow []string
	// StdlibOnly forbids every dependency outside the standard library.
	StdlibOnly bool
	// Forbid lists import-path patterns no dependency may match: "x/..." matches x and every
	// package below it, anything else is a path.Match pattern ("*" stops at a slash).
	Forbid []string
}

// Package is a node of the import graph.
type Package struct {
	// Imports are the packages it imports directly (not its tests).
	Imports []string
	// Standard is set for packages of the standard library.
	Standard bool
}

// Graph maps import paths to packages.
type Graph map[string]Package

// Load returns the import graph of the packages matching patterns (default "./..."), without
// their tests, as `go list -deps` run in dir reports it.
func Load(dir string, patterns ...string) (Graph, error) {
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	cmd := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Imports,Standard"}, patterns...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("layers: go list: %w: %s", err, stderr.String())
	}
	g := Graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Standard   bool
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return g, nil
		} else if err != nil {
			return nil, fmt.Errorf("layers: decode go list output: %w", err)
		}
		g[p.ImportPath] = Package{Imports: p.Imports, Standard: p.Standard}
	}
}

// Check returns one line for every dependency a rule forbids, with the chain of imports that
// reaches it (not for what is reached only through a forbidden one: pgx once, not each of its
// packages), and for every rule about a package the graph does not hold (a rule must not pass
// because its package was renamed). No lines: the graph keeps the rules.
func Check(g Graph, rules []Rule) []string {
	var problems []string
	for _, r := range rules {
		from := modulePath(r.Package)
		if _, ok := g[from]; !ok {
			problems = append(problems, fmt.Sprintf("%s: no such package in the graph; update the rule", short(from)))
			continue
		}
		order, parent := reach(g, from)
		refused := map[string]bool{}
		for _, dep := range order {
			if refused[parent[dep]] {
				refused[dep] = true // reported with its importer
				continue
			}
			if why := r.refuses(dep, g[dep]); why != "" {
				refused[dep] = true
				problems = append(problems, fmt.Sprintf("%s must not depend on %s (%s): %s", short(from), short(dep), why, chain(parent, from, dep)))
			}
		}
	}
	return problems
}

// refuses says why the rule forbids depending on dep, or returns "".
func (r Rule) refuses(dep string, p Package) string {
	if p.Standard {
		return ""
	}
	if r.StdlibOnly {
		return "standard library only"
	}
	if r.Leaf && isModule(dep) && !slices.Contains(r.Allow, strings.TrimPrefix(strings.TrimPrefix(dep, Module), "/")) {
		return "a leaf; allowed: " + strings.Join(r.Allow, ", ")
	}
	for _, pattern := range r.Forbid {
		if matches(pattern, dep) {
			return "forbidden: " + short(pattern)
		}
	}
	return ""
}

// reach walks the packages from imports, breadth first, and returns them in that order (from
// itself is not included) with each one's importer on a shortest chain from from.
func reach(g Graph, from string) (order []string, parent map[string]string) {
	parent = map[string]string{}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p].Imports {
			if _, seen := parent[imp]; seen || imp == from {
				continue
			}
			parent[imp] = p
			order = append(order, imp)
			queue = append(queue, imp)
		}
	}
	return order, parent
}

// chain returns the imports from from to dep: "a → b → c".
func chain(parent map[string]string, from, dep string) string {
	links := []string{short(dep)}
	for p := dep; p != from; {
		p = parent[p]
		links = append(links, short(p))
	}
	slices.Reverse(links)
	return strings.Join(links, " → ")
}

func matches(pattern, importPath string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return importPath == prefix || strings.HasPrefix(importPath, prefix+"/")
	}
	ok, err := path.Match(pattern, importPath)
	return err == nil && ok
}

func isModule(importPath string) bool {
	return importPath == Module || strings.HasPrefix(importPath, Module+"/")
}

func modulePath(p string) string {
	if p == "" {
		return Module
	}
	return Module + "/" + p
}

// short drops the module's path from an import path, for messages.
func short(importPath string) string {
	if rest, ok := strings.CutPrefix(importPath, Module+"/"); ok {
		return rest
	}
	return importPath
}

package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// pkgInfo is one parsed package of the module.
type pkgInfo struct {
	rel     string // directory relative to the root, "" for the root package
	name    string // package name
	doc     *doc.Package
	files   []*ast.File
	structs map[string]*ast.StructType
}

// qualified is the package's name in headings: its directory (nudge for the root).
func (p *pkgInfo) qualified() string {
	if p.rel == "" {
		return "nudge"
	}
	return p.rel
}

// skipDir says whether a directory's packages are not part of the public API.
func skipDir(rel string) bool {
	first, _, _ := strings.Cut(rel, "/")
	base := filepath.Base(rel)
	return first == "internal" || first == "examples" || first == "cmd" || first == "docs" || first == "bin" ||
		base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")
}

// loadPackages parses the module's public packages, without their tests.
func loadPackages(root string) (map[string]*pkgInfo, error) {
	pkgs := map[string]*pkgInfo{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			rel = ""
		}
		if rel != "" && skipDir(rel) {
			return filepath.SkipDir
		}
		p, err := parsePackage(path, rel)
		if err != nil || p == nil {
			return err
		}
		pkgs[rel] = p
		return nil
	})
	return pkgs, err
}

// parsePackage parses the non-test Go files of dir; nil when it has none.
func parsePackage(dir, rel string) (*pkgInfo, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if f.Name.Name == "main" {
			return nil, nil
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, nil
	}
	dp, err := doc.NewFromFiles(fset, files, "example.com/"+rel, doc.PreserveAST)
	if err != nil {
		return nil, err
	}
	p := &pkgInfo{rel: rel, name: dp.Name, doc: dp, files: files, structs: map[string]*ast.StructType{}}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.IsExported() {
				if st, ok := ts.Type.(*ast.StructType); ok {
					p.structs[ts.Name.Name] = st
				}
			}
			return true
		})
	}
	return p, nil
}

// typeRef is one documented struct type.
type typeRef struct {
	pkg  *pkgInfo
	name string
}

// configTypes returns the Config types of the public packages (every exported struct whose
// name ends in Config) and the struct types of the module their fields use, transitively,
// sorted by package and name.
func configTypes(pkgs map[string]*pkgInfo, module string) []typeRef {
	seen := map[typeRef]bool{}
	var queue []typeRef
	add := func(r typeRef) {
		if !seen[r] {
			seen[r] = true
			queue = append(queue, r)
		}
	}
	for _, p := range pkgs {
		for name := range p.structs {
			if strings.HasSuffix(name, "Config") {
				add(typeRef{p, name})
			}
		}
	}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		for _, field := range r.pkg.structs[r.name].Fields.List {
			if ref, ok := resolveStruct(pkgs, module, r.pkg, field.Type); ok {
				add(ref)
			}
		}
	}
	out := make([]typeRef, 0, len(seen))
	for r := range seen {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b typeRef) int {
		if c := strings.Compare(a.pkg.rel, b.pkg.rel); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return out
}

// resolveStruct finds the module's exported struct type that expr names (a value, not a
// pointer, slice or function).
func resolveStruct(pkgs map[string]*pkgInfo, module string, in *pkgInfo, expr ast.Expr) (typeRef, bool) {
	switch e := expr.(type) {
	case *ast.Ident:
		if _, ok := in.structs[e.Name]; ok {
			return typeRef{in, e.Name}, true
		}
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		if !ok {
			return typeRef{}, false
		}
		if p := importedPackage(pkgs, module, in, x.Name); p != nil {
			if _, ok := p.structs[e.Sel.Name]; ok {
				return typeRef{p, e.Sel.Name}, true
			}
		}
	}
	return typeRef{}, false
}

// importedPackage returns the module's package that the files of in import as name.
func importedPackage(pkgs map[string]*pkgInfo, module string, in *pkgInfo, name string) *pkgInfo {
	for _, f := range in.files {
		for _, imp := range f.Imports {
			rel, ok := strings.CutPrefix(strings.Trim(imp.Path.Value, `"`), module+"/")
			p := pkgs[rel]
			if !ok || p == nil {
				continue
			}
			local := p.name
			if imp.Name != nil {
				local = imp.Name.Name
			}
			if local == name {
				return p
			}
		}
	}
	return nil
}

// defaultRE finds the sentence of a field's doc that gives its default.
var defaultRE = regexp.MustCompile(`(?:^|[.;:] |^[A-Z]\w* )(?:Defaults?|defaults) (?:to|is) (.+?)(?:\.(?: [A-Z(]|$)|$)`)

// fieldDefault returns a field's default: from its doc ("Defaults to X."), else the
// exported constant <Field>Default of its package, else "".
func fieldDefault(p *pkgInfo, field, text string) string {
	if m := defaultRE.FindStringSubmatch(text); m != nil {
		return m[1]
	}
	if p.doc == nil {
		return ""
	}
	for _, c := range p.doc.Consts {
		for _, n := range c.Names {
			if n == field+"Default" {
				return "`" + p.name + "." + n + "`"
			}
		}
	}
	return ""
}

// oneLine joins a doc comment's lines into one paragraph for a table cell.
func oneLine(text string) string {
	text = strings.Join(strings.Fields(text), " ")
	return strings.ReplaceAll(text, "|", `\|`)
}

// configReference renders docs/reference/configuration.md.
func configReference(root, module string) ([]byte, error) {
	pkgs, err := loadPackages(root)
	if err != nil {
		return nil, err
	}
	refs := configTypes(pkgs, module)
	var b bytes.Buffer
	b.WriteString(generatedHeader("Configuration reference", "the Go doc comments of the Config types"))
	b.WriteString("Every exported `…Config` struct of the public packages, and the structs their fields take, " +
		"field by field. A zero field takes the default shown (from the field's doc or its package's " +
		"`<Field>Default` constant); the description is the field's doc comment. `go doc` shows the same text.\n\n")
	for _, r := range refs {
		heading := r.pkg.qualified() + "." + r.name
		fmt.Fprintf(&b, "- [%s](#%s)\n", heading, slug(heading))
	}
	for _, r := range refs {
		writeStruct(&b, r, pkgs, module)
	}
	return b.Bytes(), nil
}

func writeStruct(b *bytes.Buffer, r typeRef, pkgs map[string]*pkgInfo, module string) {
	path := module
	if r.pkg.rel != "" {
		path += "/" + r.pkg.rel
	}
	fmt.Fprintf(b, "\n## %s.%s\n\n`import %q`\n\n", r.pkg.qualified(), r.name, path)
	for _, t := range r.pkg.doc.Types {
		if t.Name == r.name && t.Doc != "" {
			fmt.Fprintf(b, "%s\n\n", oneLine(t.Doc))
		}
	}
	b.WriteString("| Field | Type | Default | Description |\n|---|---|---|---|\n")
	for _, f := range r.pkg.structs[r.name].Fields.List {
		writeField(b, r, f, pkgs, module)
	}
}

// writeField writes a struct field's row; none for an unexported field.
func writeField(b *bytes.Buffer, r typeRef, f *ast.Field, pkgs map[string]*pkgInfo, module string) {
	names := make([]string, 0, len(f.Names))
	for _, n := range f.Names {
		if n.IsExported() {
			names = append(names, n.Name)
		}
	}
	typ := types.ExprString(f.Type)
	if len(f.Names) == 0 { // embedded
		names = []string{strings.TrimPrefix(typ[strings.LastIndex(typ, ".")+1:], "*")}
	}
	if len(names) == 0 {
		return
	}
	text := f.Doc.Text()
	if text == "" {
		text = f.Comment.Text()
	}
	def := oneLine(fieldDefault(r.pkg, names[0], oneLine(text)))
	if nested, ok := resolveStruct(pkgs, module, r.pkg, f.Type); ok && def == "" {
		heading := nested.pkg.qualified() + "." + nested.name
		def = fmt.Sprintf("field by field: [%s](#%s)", heading, slug(heading))
	}
	if def == "" {
		def = "—"
	}
	fmt.Fprintf(b, "| `%s` | `%s` | %s | %s |\n", strings.Join(names, "`, `"), strings.ReplaceAll(typ, "|", `\|`), def, oneLine(text))
}

package readme_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// root is the repository's root, from this package's directory.
var root = filepath.Join("..", "..")

// block is one fenced block of a Markdown file.
type block struct {
	line   int    // of the opening fence
	lang   string // the fence's info string, e.g. go or sh
	code   string
	tested bool // the line before the fence (blank lines aside) is <!-- test -->
}

// testMarker marks a shell block that TestShellBlocks runs.
const testMarker = "<!-- test -->"

// mdDoc is a parsed Markdown file: its fenced blocks and its lines outside them.
type mdDoc struct {
	path   string   // relative to root, slash-separated
	blocks []block  // fenced blocks
	prose  []string // lines outside fenced blocks; "" in place of a block's lines
}

// parseMarkdown reads the Markdown file at path (relative to root); indented fences (inside
// a list item) count, their indentation removed from the block's lines.
func parseMarkdown(t *testing.T, path string) mdDoc {
	t.Helper()
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(path)))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	d := mdDoc{path: path}
	var (
		cur      *block
		indent   string
		fenceLen int
		lastText string
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			fenceLen = len(trimmed) - len(strings.TrimLeft(trimmed, "`"))
			cur = &block{line: n, lang: strings.TrimSpace(trimmed[fenceLen:]), tested: lastText == testMarker}
			indent = line[:strings.Index(line, "```")]
			d.prose = append(d.prose, "")
		case cur != nil && strings.HasPrefix(trimmed, strings.Repeat("`", fenceLen)) && strings.Trim(trimmed, "`") == "":
			d.blocks = append(d.blocks, *cur)
			cur = nil
			d.prose = append(d.prose, "")
			lastText = ""
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
			d.prose = append(d.prose, "")
		default:
			d.prose = append(d.prose, line)
			if trimmed != "" {
				lastText = trimmed
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a fenced block that does not end", path)
	return d
}

// markdownFiles returns README.md and every Markdown file under docs/, plus extra (those that
// exist), relative to root.
func markdownFiles(t *testing.T, extra ...string) []string {
	t.Helper()
	var out []string
	for _, name := range append([]string{"README.md"}, extra...) {
		if _, err := os.Stat(filepath.Join(root, name)); err == nil {
			out = append(out, name)
		}
	}
	docs := filepath.Join(root, "docs")
	if _, err := os.Stat(docs); err != nil {
		return out
	}
	err := filepath.WalkDir(docs, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	require.NoError(t, err)
	return out
}

var (
	headingRE  = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	mdLinkInRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	slugDropRE = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	inlineCode = regexp.MustCompile("`[^`]*`")
	linkRE     = regexp.MustCompile(`!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlHrefRE = regexp.MustCompile(`<a\s+[^>]*href="([^"]+)"`)
	schemeRE   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	htmlTagRE  = regexp.MustCompile(`<[^>]+>`)
	codeTextRE = regexp.MustCompile("`([^`]*)`")
)

// slug is GitHub's anchor for a heading's text: markup dropped (link targets, tags), lower
// case, every character but letters, digits, spaces, - and _ dropped, spaces turned into -.
func slug(heading string) string {
	s := mdLinkInRE.ReplaceAllString(heading, "$1")
	s = htmlTagRE.ReplaceAllString(s, "")
	s = codeTextRE.ReplaceAllString(s, "$1")
	s = strings.ToLower(strings.TrimSpace(s))
	s = slugDropRE.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// anchors returns the #anchors of a parsed file: its headings' slugs (a repeated one with
// -1, -2, … as GitHub numbers them) and its <a name> / id anchors.
func anchors(d mdDoc) map[string]bool {
	out := map[string]bool{}
	count := map[string]int{}
	for _, line := range d.prose {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			s := slug(m[2])
			if n := count[s]; n > 0 {
				out[s+"-"+strconv.Itoa(n)] = true
			} else {
				out[s] = true
			}
			count[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// link is one link of a Markdown file.
type link struct {
	line   int
	target string
}

// links returns the link targets of a parsed file's prose, inline code spans excepted.
func links(d mdDoc) []link {
	var out []link
	for i, line := range d.prose {
		line = inlineCode.ReplaceAllString(line, "``")
		var targets []string
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		for _, m := range htmlHrefRE.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refDefRE.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			out = append(out, link{line: i + 1, target: target})
		}
	}
	return out
}

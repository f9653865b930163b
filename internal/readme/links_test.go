package readme_test

import (
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMarkdownLinks checks every relative link of README.md, CONTRIBUTING.md, RELIABILITY.md,
// CHANGELOG.md and docs/**/*.md: the file or directory it names exists, and its #anchor is a
// heading (GitHub's slug) or an <a name> of the Markdown file it leads to.
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t, "CONTRIBUTING.md", "RELIABILITY.md", "CHANGELOG.md")
	docs := map[string]mdDoc{}
	doc := func(p string) mdDoc {
		d, ok := docs[p]
		if !ok {
			d = parseMarkdown(t, p)
			docs[p] = d
		}
		return d
	}
	checked := 0
	for _, file := range files {
		for _, l := range links(doc(file)) {
			if problem := checkLink(file, l.target, doc); problem != "" {
				t.Errorf("%s:%d: link %q: %s", file, l.line, l.target, problem)
			}
			checked++
		}
	}
	require.NotZero(t, checked, "no links found: the parser is broken")
}

// checkLink returns what is wrong with a link of file (relative to root), or "".
func checkLink(file, target string, doc func(string) mdDoc) string {
	if schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // absolute (https:, mailto:): not checked here
	}
	p, frag, _ := strings.Cut(target, "#")
	if unescaped, err := url.PathUnescape(p); err == nil {
		p = unescaped
	}
	dest := file
	if p != "" {
		if strings.HasPrefix(p, "/") {
			dest = path.Clean(strings.TrimPrefix(p, "/"))
		} else {
			dest = path.Clean(path.Join(path.Dir(file), p))
		}
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "leads out of the repository"
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
			return "no such file or directory " + dest
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return "" // no anchor, or a line anchor of a source file (#L10)
	}
	if !anchors(doc(dest))[strings.ToLower(frag)] {
		return "no heading or <a name> makes the anchor #" + frag + " in " + dest
	}
	return ""
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Quick start":                         "quick-start",
		"nudge.Config":                        "nudgeconfig",
		"`nudge status` and `--watch`":        "nudge-status-and---watch",
		"What if RabbitMQ is down?":           "what-if-rabbitmq-is-down",
		"[Links](x.md) & <b>tags</b>":         "links--tags",
		"Retry, dead letters and redrive (2)": "retry-dead-letters-and-redrive-2",
		"snake_case stays":                    "snake_case-stays",
	} {
		require.Equal(t, want, slug(heading), heading)
	}
}

func TestAnchorsNumberRepeatedHeadings(t *testing.T) {
	t.Parallel()
	d := mdDoc{prose: []string{"# Title", "## Usage", "text", "## Usage", `<a name="custom"></a>`, "    # not a heading: code"}}
	got := anchors(d)
	for _, want := range []string{"title", "usage", "usage-1", "custom"} {
		require.True(t, got[want], want)
	}
	require.False(t, got["not-a-heading-code"])
}

// TestCheckLinkFindsBrokenLinks: the checker accepts links that lead somewhere and names
// what is wrong with those that do not.
func TestCheckLinkFindsBrokenLinks(t *testing.T) {
	t.Parallel()
	doc := func(p string) mdDoc { return parseMarkdown(t, p) }
	for target, want := range map[string]string{
		"docs/reference/cli.md#nudge-status": "",
		"docs/reference/":                    "",
		"https://example.com/#x":             "",
		"config.go#L10":                      "",
		"#no-such-heading-here":              "no heading or <a name> makes the anchor #no-such-heading-here in README.md",
		"docs/missing.md":                    "no such file or directory docs/missing.md",
		"docs/reference/cli.md#nope":         "no heading or <a name> makes the anchor #nope in docs/reference/cli.md",
		"../../etc/passwd":                   "leads out of the repository",
	} {
		require.Equal(t, want, checkLink("README.md", target, doc), target)
	}
}

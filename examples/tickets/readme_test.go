package main

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// curlCommand is a request a curl command line of README.md sends.
type curlCommand struct {
	line               int
	method, path, body string
}

func (c curlCommand) key() string { return requestKey(c.method, c.path, c.body) }

// readmeCurls returns the curl commands of the shell blocks of a README.
func readmeCurls(path string) ([]curlCommand, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		cmds    []curlCommand
		inShell bool
		n       int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			inShell = !inShell && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell")
			continue
		case !inShell:
			continue
		}
		for rest := line; ; {
			i := curlStart(rest)
			if i < 0 {
				break
			}
			words, consumed, err := shellWords(rest[i+len("curl"):])
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
			c, err := parseCurl(words)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
			c.line = n
			cmds = append(cmds, c)
			rest = rest[i+len("curl")+consumed:]
		}
	}
	return cmds, sc.Err()
}

// curlStart finds the word curl in s: at its start or after a space, '(' or '|'.
func curlStart(s string) int {
	for i := 0; ; {
		j := strings.Index(s[i:], "curl ")
		if j < 0 {
			return -1
		}
		j += i
		if j == 0 || strings.ContainsRune(" \t(|;&", rune(s[j-1])) {
			return j
		}
		i = j + 1
	}
}

// shellWords splits s into words the way a POSIX shell would, for the quoting README.md
// uses ('…', "…" with \" and \\, variables kept as written), up to an unquoted |, ), ;, & or #.
// It returns the words and how many bytes it read.
func shellWords(s string) ([]string, int, error) {
	var (
		words  []string
		word   strings.Builder
		inWord bool
	)
	flush := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case strings.IndexByte("|);&#", c) >= 0:
			flush()
			return words, i, nil
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, 0, errors.New("unterminated '")
			}
			word.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 1
		case c == '"':
			inWord = true
			for i++; ; i++ {
				if i >= len(s) {
					return nil, 0, errors.New(`unterminated "`)
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(`"\$`, s[i+1]) >= 0 {
					i++
					word.WriteByte(s[i])
					continue
				}
				if s[i] == '"' {
					break
				}
				word.WriteByte(s[i])
			}
		default:
			word.WriteByte(c)
			inWord = true
		}
		i++
	}
	flush()
	return words, i, nil
}

// parseCurl reads the request from curl's arguments.
func parseCurl(args []string) (curlCommand, error) {
	var c curlCommand
	var rawURL string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-X" || a == "--request" || a == "-d" || a == "--data":
			if i+1 >= len(args) {
				return c, fmt.Errorf("curl %s without a value", a)
			}
			i++
			if a == "-X" || a == "--request" {
				c.method = args[i]
			} else {
				c.body = args[i]
			}
		case strings.HasPrefix(a, "-"):
			// -s, -i, -S, -f: options without a value
		case rawURL == "":
			rawURL = a
		default:
			return c, fmt.Errorf("curl with a second URL %q", a)
		}
	}
	if rawURL == "" {
		return c, errors.New("curl without a URL")
	}
	if c.method == "" {
		c.method = http.MethodGet
		if c.body != "" {
			c.method = http.MethodPost
		}
	}
	rawURL = strings.TrimPrefix(strings.TrimPrefix(rawURL, "http://"), "https://")
	slash := strings.IndexByte(rawURL, '/')
	if slash < 0 {
		return c, fmt.Errorf("curl URL %q has no path", rawURL)
	}
	c.path = rawURL[slash:]
	return c, nil
}

// TestReadmeCurls: the README's curl commands are found and parsed, and together they call
// every endpoint — so the check in TestMain, which requires the tests to send each of them,
// cannot pass by finding none.
func TestReadmeCurls(t *testing.T) {
	t.Parallel()
	cmds, err := readmeCurls("README.md")
	require.NoError(t, err)
	routes := map[string]bool{}
	for _, c := range cmds {
		path, _, _ := strings.Cut(c.path, "?")
		path = strings.ReplaceAll(path, "$ID", "{id}")
		routes[c.method+" "+path] = true
	}
	for _, want := range []string{"POST /tickets", "POST /tickets/{id}/close", "GET /tickets", "GET /stats", "GET /status",
		"POST /replay", "GET /healthz"} {
		require.True(t, routes[want], "README.md has no curl command for %s; found %v", want, routes)
	}
}

func TestShellWords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want curlCommand
	}{
		{` -s localhost:8080/status | jq .`, curlCommand{method: "GET", path: "/status"}},
		{` -s -X POST localhost:8080/tickets -d '{"title":"A b","customer":"c"}' | jq -r .id)`,
			curlCommand{method: "POST", path: "/tickets", body: `{"title":"A b","customer":"c"}`}},
		{` -s -d "{\"title\":\"$LONG\"}" localhost:8080/tickets`, curlCommand{method: "POST", path: "/tickets", body: `{"title":"$LONG"}`}},
		{` -s -X POST 'localhost:8080/replay?projection=all'`, curlCommand{method: "POST", path: "/replay?projection=all"}},
		{` -s -X POST localhost:8080/tickets/$ID/close -d '{}'   # comment`, curlCommand{method: "POST", path: "/tickets/$ID/close", body: `{}`}},
	} {
		words, _, err := shellWords(tc.in)
		require.NoError(t, err, tc.in)
		got, err := parseCurl(words)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	_, _, err := shellWords(` -d '{"a":1}`)
	require.Error(t, err)
}

package console

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVisible: control characters, bidi overrides and invalid bytes are written out; the rest
// is left alone (html/template escapes it).
func TestVisible(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"plain <b>":                "plain <b>",
		"\x1b[31mred\x1b[0m":       `\x1b[31mred\x1b[0m`,
		"tab\there\r\n":            `tab\there\r\n`,
		"abc\u202edcba":            `abc\u202edcba`,
		"bad \xff byte":            `bad \xff byte`,
		"ünïcödé stays":            "ünïcödé stays",
		"\u0007bell and \u009bcsi": `\abell and \u009bcsi`,
	}
	for in, want := range cases {
		require.Equal(t, want, visible(in), "%q", in)
	}
	require.Equal(t, "a\n\\x1b", visibleLines("a\n\x1b"), "lines keeps the line breaks")
}

// TestRate: throughputs read the short way.
func TestRate(t *testing.T) {
	t.Parallel()
	cases := map[float64]string{0: "0/s", -1: "0/s", 0.44: "0.4/s", 9.96: "10/s", 12.4: "12/s", 9999: "9999/s",
		12_345: "12.3k/s", 123_456: "123k/s"}
	for in, want := range cases {
		require.Equal(t, want, rate(in), "%v", in)
	}
}

package main

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestTerminalSafe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"Ticket was priced: 12 € (é, 日本, \\x1b stays)", "Ticket was priced: 12 € (é, 日本, \\x1b stays)"},
		{"a\x1b[31mb\rc\u009bd é", `a\x1b[31mb\rc\u009bd é`},
		{"tab\tnl\nnul\x00del\x7f", `tab\tnl\nnul\x00del\x7f`},
		{"bad \xff\xfe utf8 \xe2\x82", `bad \xff\xfe utf8 \xe2\x82`},
		{"\uFFFD is a real replacement character", "\uFFFD is a real replacement character"},
	} {
		got := terminalSafe(tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
		require.Equal(t, got, terminalSafe(got), "escaping twice changes nothing: %q", tc.in)
	}
}

func TestTerminalSafeLines(t *testing.T) {
	require.Equal(t, "value \\x1b[31m\\r\nrun 'nudge status'", terminalSafeLines("value \x1b[31m\r\nrun 'nudge status'"))
}

func FuzzTerminalSafe(f *testing.F) {
	for _, s := range []string{"plain", "a\x1b[31mb\rc", "\u009b\x7f", "\xff\xc3", "é\u200b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := terminalSafe(s)
		require.True(t, utf8.ValidString(got), "%q", got)
		require.Equal(t, -1, strings.IndexFunc(got, unicode.IsControl), "%q", got)
		require.Equal(t, got, terminalSafe(got))
		if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
			require.Equal(t, s, got)
		}
	})
}

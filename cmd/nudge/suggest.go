package main

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// closest returns the word of known that got is most likely a typo of, or "" if none is close:
// at most one edit away for short words, two for words of four letters or more (a swap of two
// neighbouring letters counts as one edit), or a word that got starts (at least three letters).
func closest(got string, known []string) string {
	limit := 1
	if len(got) >= 4 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for _, k := range known {
		if d := editDistance(got, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" || len(got) < 3 {
		return best
	}
	for _, k := range known {
		if strings.HasPrefix(k, got) {
			return k
		}
	}
	return ""
}

// editDistance is the optimal string alignment distance between a and b: insertions,
// deletions, substitutions and swaps of neighbouring letters, each one edit.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// rows i-2, i-1 and i of the table.
	prev2, prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1), make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// didYouMean is " (did you mean "x"?)" for the closest word of known, or "".
func didYouMean(got string, known []string) string {
	if s := closest(got, known); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// flagNames lists the flags of fs.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// singleDash finds a flag name written with one dash in the flag package's messages.
var singleDash = regexp.MustCompile(`(^|\s)-([a-z][a-z0-9-]*)`)

// flagError rewrites an error of fs.Parse the way the help shows flags, with two dashes, and
// suggests the flag meant for an unknown one.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimPrefix(name, "-")
		if s := closest(name, flagNames(fs)); s != "" {
			return fmt.Sprintf("unknown flag --%s (did you mean --%s?)", name, s)
		}
		return "unknown flag --" + name
	}
	return singleDash.ReplaceAllString(msg, "$1--$2")
}

// printFlags prints the flags of fs as flag.PrintDefaults does, but with two dashes, as the
// rest of the help writes them.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  --%s", f.Name)
		valueName, usage := flag.UnquoteUsage(f)
		if valueName != "" {
			b.WriteString(" " + valueName)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch def := f.DefValue; {
		case def == "" || def == "false" || def == "0" || def == "0s":
		case isString(f):
			fmt.Fprintf(&b, " (default %q)", def)
		default:
			fmt.Fprintf(&b, " (default %s)", def)
		}
		fmt.Fprintln(w, b.String())
	})
}

// isString reports whether f holds a string.
func isString(f *flag.Flag) bool {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, ok = g.Get().(string)
	return ok
}

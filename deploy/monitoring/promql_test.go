package monitoring

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// promqlKeywords are the identifiers of PromQL that name no series:
// operators, modifiers and aggregations (which may stand apart from
// their parentheses, as in `sum by (x) (...)`), and number literals.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"inf": true, "nan": true,
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// metricNames returns the metric names an expression selects, sorted and
// without repeats. It reads PromQL as far as telling names apart needs:
// string literals, label matchers ({...}), ranges and durations ([...]),
// function calls, keywords and label lists are skipped, and so are
// Grafana's variables ($var, ${var}). An expression it cannot read (an
// unclosed string, brace or bracket) is an error.
func metricNames(expr string) ([]string, error) {
	var names []string
	rs := []rune(expr)
	i := 0
	skipTo := func(close rune) error {
		open := rs[i]
		for i++; i < len(rs); i++ {
			switch {
			case rs[i] == '"' || rs[i] == '\'' || rs[i] == '`':
				if err := skipString(rs, &i); err != nil {
					return err
				}
			case rs[i] == close:
				i++
				return nil
			}
		}
		return fmt.Errorf("unclosed %q in %q", open, expr)
	}
	nextNonSpace := func(j int) int {
		for j < len(rs) && unicode.IsSpace(rs[j]) {
			j++
		}
		return j
	}
	for i < len(rs) {
		c := rs[i]
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '"' || c == '\'' || c == '`':
			if err := skipString(rs, &i); err != nil {
				return nil, err
			}
			i++
		case c == '{':
			if err := skipTo('}'); err != nil {
				return nil, err
			}
		case c == '[':
			if err := skipTo(']'); err != nil {
				return nil, err
			}
		case c == '$':
			i++
			if i < len(rs) && rs[i] == '{' {
				if err := skipTo('}'); err != nil {
					return nil, err
				}
				continue
			}
			for i < len(rs) && isIdentRune(rs[i], false) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			// A number or a duration (5m, 1d2h, 1e3).
			for i < len(rs) && (isIdentRune(rs[i], false) || rs[i] == '.') {
				i++
			}
		case isIdentRune(c, true):
			start := i
			for i < len(rs) && isIdentRune(rs[i], false) {
				i++
			}
			word := string(rs[start:i])
			j := nextNonSpace(i)
			switch {
			case labelListKeywords[strings.ToLower(word)]:
				if j < len(rs) && rs[j] == '(' {
					i = j
					if err := skipTo(')'); err != nil {
						return nil, err
					}
				}
			case promqlKeywords[strings.ToLower(word)]:
			case j < len(rs) && rs[j] == '(':
				// A function call: its arguments are read on.
			default:
				names = append(names, word)
			}
		default:
			i++
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// skipString moves *i from a string's opening quote to its closing one.
func skipString(rs []rune, i *int) error {
	q := rs[*i]
	for j := *i + 1; j < len(rs); j++ {
		switch {
		case rs[j] == '\\' && q != '`':
			j++
		case rs[j] == q:
			*i = j
			return nil
		}
	}
	return fmt.Errorf("unclosed string in %q", string(rs))
}

// isIdentRune: metric names are [a-zA-Z_:][a-zA-Z0-9_:]*.
func isIdentRune(r rune, first bool) bool {
	switch {
	case r == '_' || r == ':' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		return true
	case r >= '0' && r <= '9':
		return !first
	}
	return false
}

package chattemplate

import "strings"

// rewrite renames the tojson filter in src's expressions to tojsonName,
// so that transformers' tojson (filterToJSON) renders it, gives every
// macro a last parameter whose default calls macroGuardName, so that each
// call of a macro is counted (see macroCallBudget), and writes the
// operands of an output's string concatenation one by one (splitConcat).
// Only code is touched: text outside {{ }} and {% %}, comments, string
// literals and {% raw %} blocks are left as they are. A name is a filter
// when '|' (and optional spaces) comes before it and no identifier
// character follows it.
func rewrite(src string) string {
	if !strings.Contains(src, "tojson") && !strings.Contains(src, "macro") && !strings.Contains(src, "+") {
		return src
	}
	var out strings.Builder
	out.Grow(len(src) + 64)
	i := 0
	for i < len(src) {
		open := strings.IndexByte(src[i:], '{')
		if open < 0 || i+open+1 >= len(src) {
			out.WriteString(src[i:])
			break
		}
		open += i
		out.WriteString(src[i:open])
		switch src[open+1] {
		case '#':
			end := strings.Index(src[open:], "#}")
			if end < 0 {
				out.WriteString(src[open:])
				return out.String()
			}
			out.WriteString(src[open : open+end+2])
			i = open + end + 2
		case '{', '%':
			closer := "}}"
			if src[open+1] == '%' {
				closer = "%}"
			}
			var tag strings.Builder
			j := scanCode(src, open+2, closer, &tag, src[open:open+2])
			out.WriteString(splitConcat(guardMacro(tag.String())))
			if src[open+1] == '%' && isRawStart(src[open+2:j]) {
				end := strings.Index(src[j:], "endraw")
				if end < 0 {
					out.WriteString(src[j:])
					return out.String()
				}
				out.WriteString(src[j : j+end])
				i = j + end
				continue
			}
			i = j
		default:
			out.WriteByte('{')
			i = open + 1
		}
	}
	return out.String()
}

// scanCode copies the code of one tag from src[start:] up to and including
// closer (outside string literals) into out, after prefix, renaming
// tojson filters, and returns where it stopped.
func scanCode(src string, start int, closer string, out *strings.Builder, prefix string) int {
	out.WriteString(prefix)
	lastNonSpace := byte(0)
	i := start
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			j := min(i+closingQuote(src[i:])+1, len(src))
			out.WriteString(src[i:j])
			lastNonSpace = c
			i = j
		case strings.HasPrefix(src[i:], closer):
			out.WriteString(closer)
			return i + len(closer)
		case isIdentStart(c):
			j := i
			for j < len(src) && isIdent(src[j]) {
				j++
			}
			word := src[i:j]
			if word == "tojson" && lastNonSpace == '|' {
				word = tojsonName
			}
			out.WriteString(word)
			lastNonSpace = 'a'
			i = j
		default:
			out.WriteByte(c)
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				lastNonSpace = c
			}
			i++
		}
	}
	return i
}

// isRawStart reports whether a {% %} tag's code is "raw" (with optional
// whitespace-control dashes).
func isRawStart(code string) bool {
	code = strings.TrimSuffix(code, "%}")
	code = strings.Trim(code, "-+ \t\r\n")
	return code == "raw"
}

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// guardMacro adds the counting parameter to a {% macro name(...) %} tag.
func guardMacro(tag string) string {
	code := strings.TrimLeft(tag[2:], "-+ \t\r\n")
	if !strings.HasPrefix(tag, "{%") || !strings.HasPrefix(code, "macro") || len(code) == len("macro") || isIdent(code[len("macro")]) {
		return tag
	}
	end := strings.LastIndexByte(tag, ')')
	if end < 0 {
		return tag // not a macro the engine compiles; let it say so
	}
	sep := ", "
	if strings.TrimSpace(tag[strings.IndexByte(tag, '(')+1:end]) == "" {
		sep = ""
	}
	return tag[:end] + sep + macroGuardParam + "=" + macroGuardName + "()" + tag[end:]
}

// splitConcat turns an output tag whose expression is a chain of `+`
// with a string literal among its operands into one tag per operand:
// {{- '<|im_start|>' + message.role + '\n' }} becomes
// {{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}. Writing the operands
// in turn is what the chain renders: Jinja refuses `+` between a string
// and anything else, so in a template that renders, every operand of such
// a chain is a string. Chat templates put every message's content in one
// of these chains, and each `+` copied the growing string again: the
// copies were most of what rendering a long conversation allocated
// (BenchmarkChatTurn/render). Any other tag, and any chain with another
// operator, a test or a conditional at its top level, is left as it is.
func splitConcat(tag string) string {
	if !strings.HasPrefix(tag, "{{") || !strings.HasSuffix(tag, "}}") || !strings.Contains(tag, "+") {
		return tag
	}
	expr := tag[2 : len(tag)-2]
	lead, trail := "", ""
	if expr != "" && (expr[0] == '-' || expr[0] == '+') {
		lead, expr = expr[:1], expr[1:]
	}
	if n := len(expr); n > 0 && (expr[n-1] == '-' || expr[n-1] == '+') {
		trail, expr = expr[n-1:], expr[:n-1]
	}
	var operands []string
	literal := false
	depth, start := 0, 0
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '\'' || c == '"':
			j := i + closingQuote(expr[i:])
			if j >= len(expr) {
				return tag // an unterminated literal: the engine will say so
			}
			i = j
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth > 0:
		case c == '+':
			operands = append(operands, strings.TrimSpace(expr[start:i]))
			start = i + 1
		case strings.IndexByte("-*/%~<>=!", c) >= 0:
			return tag // another operator: precedence would matter
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			switch expr[i:j] {
			case "if", "else", "and", "or", "not", "in", "is":
				return tag
			}
			i = j - 1
		}
	}
	operands = append(operands, strings.TrimSpace(expr[start:]))
	if depth != 0 || len(operands) < 2 {
		return tag
	}
	for _, op := range operands {
		if op == "" {
			return tag // a unary +
		}
		if q := op[0]; (q == '\'' || q == '"') && closingQuote(op) == len(op)-1 {
			literal = true
		}
	}
	if !literal {
		return tag // numbers or lists may be what it adds
	}
	var b strings.Builder
	for i, op := range operands {
		b.WriteString("{{")
		if i == 0 {
			b.WriteString(lead)
		}
		b.WriteString(" " + op + " ")
		if i == len(operands)-1 {
			b.WriteString(trail)
		}
		b.WriteString("}}")
	}
	return b.String()
}

// closingQuote returns the index of the quote that closes the string
// literal lit starts with (len(lit) or more if none does).
func closingQuote(lit string) int {
	q := lit[0]
	j := 1
	for j < len(lit) && lit[j] != q {
		if lit[j] == '\\' {
			j++
		}
		j++
	}
	return j
}

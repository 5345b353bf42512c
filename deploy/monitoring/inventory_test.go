package monitoring

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// kvindexName is what every metric kvindex exports is called.
var kvindexName = regexp.MustCompile(`^kvindex_[a-z0-9_]+$`)

// exportedMetrics returns the names of the series kvindex's components
// export, read from the metric constructors in the module's Go source
// under root: the name literal that is the Name of a prometheus.*Opts,
// or the first argument of a call (prometheus.NewDesc and the packages'
// small wrappers of it and of NewCounterFunc). A histogram's name stands
// for its _bucket, _sum and _count series.
//
// Why the source rather than a running process's registry: a registry
// lists a vector only once it has a child and an unchecked collector
// (api/server's engine series) describes nothing, so gathering would
// need every engine state, error and fallback to happen first; and the
// relay's and the NATS replicas' metrics would need a NATS server and
// engines. Every metric kvindex registers is named by such a literal, so
// the constructors are the complete list; a name built at run time would
// be missing here and fail the test that uses it, not pass it.
func exportedMetrics(root string) (map[string]bool, error) {
	names := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				histogram := isSelector(n.Type, "prometheus", "HistogramOpts")
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isIdent(kv.Key, "Name") {
						if name, ok := metricLiteral(kv.Value); ok {
							add(names, name, histogram)
						}
					}
				}
			case *ast.CallExpr:
				if len(n.Args) > 0 {
					if name, ok := metricLiteral(n.Args[0]); ok {
						add(names, name, false)
					}
				}
			}
			return true
		})
		return nil
	})
	return names, err
}

func add(names map[string]bool, name string, histogram bool) {
	names[name] = true
	if histogram {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[name+s] = true
		}
	}
}

func metricLiteral(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil && kvindexName.MatchString(s)
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	return ok && isIdent(sel.X, pkg) && sel.Sel.Name == name
}

package server

import (
	"cmp"
	_ "embed"
	"net/http"
	"strconv"
)

// openAPIDocument is the OpenAPI 3.1 document of the HTTP API (Handler's
// endpoints, and /v1/pick of serve --picker). The TestOpenAPI tests hold it to the
// handlers: every route documented, every documented answer shaped as
// the Go types the handlers write.
//
//go:embed openapi.json
var openAPIDocument []byte

// openAPIPath is where Handler serves openAPIDocument.
const openAPIPath = "/openapi.json"

// openAPIHandler serves the document.
func openAPIHandler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(openAPIDocument)))
	w.Write(openAPIDocument)
}

// indexHandler answers GET /: what this server is, its endpoints and
// where they are described, for whoever points a browser or curl at the
// port.
func indexHandler(routes []route) http.Handler {
	var endpoints []string
	for _, r := range routes {
		if r.path != "/" {
			endpoints = append(endpoints, cmp.Or(r.method, http.MethodGet)+" "+r.path)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Service   string   `json:"service"`
			OpenAPI   string   `json:"openapi"`
			Endpoints []string `json:"endpoints"`
		}{"kvindex", openAPIPath, endpoints})
	})
}

// OpenAPIDocument returns the OpenAPI 3.1 document (JSON) of the HTTP API
// that Handler serves at /openapi.json, /v1/pick included. The caller must
// not modify it.
func OpenAPIDocument() []byte { return openAPIDocument }

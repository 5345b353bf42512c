package server

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/picker"
)

// pickPath is serve --picker's endpoint, which the service adds beside
// Handler's and the document describes too.
const pickPath = "/v1/pick"

// openAPIDoc is the document, decoded for the schema compiler (numbers
// kept exact).
func openAPIDoc(t *testing.T) map[string]any {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPIDocument))
	if err != nil {
		t.Fatal(err)
	}
	return doc.(map[string]any)
}

// operations lists the document's operations as "METHOD /path".
func operations(doc map[string]any) map[string]map[string]any {
	ops := map[string]map[string]any{}
	for path, item := range doc["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			ops[strings.ToUpper(method)+" "+path] = op.(map[string]any)
		}
	}
	return ops
}

// The document names every route Handler serves, with its method, and
// nothing it does not serve (serve --picker's /v1/pick aside).
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	f := newFixture(t, nil)
	doc := openAPIDoc(t)
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi %v", doc["openapi"])
	}
	var served []string
	for _, r := range append(f.srv.apiRoutes(), f.srv.commonRoutes()...) {
		served = append(served, cmpOr(r.method, http.MethodGet)+" "+r.path)
	}
	served = append(served, "GET /", "POST "+pickPath)
	documented := slices.Sorted(maps.Keys(operations(doc)))
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("openapi.json documents\n%v\nthe handlers serve\n%v", documented, served)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Every documented operation, called as its example shows against a live
// server holding blocks of three engines, answers a documented status
// with a body its schema accepts; GET / and GET /openapi.json point to and
// serve the document.
func TestOpenAPIAnswersMatchTheDocument(t *testing.T) {
	streams := &fakeStreams{}
	streams.set(kvevents.StreamStats{Engine: engine("a", 0), Endpoint: "tcp://a:5557", Connected: true, LastSeq: 3})
	f := newFixture(t, func(c *Config) { c.Streams = streams })
	loadThree(t, f, testutil.Seq(1, 64))
	doc := openAPIDoc(t)
	c := jsonschema.NewCompiler()
	if err := c.AddResource("openapi.json", doc); err != nil {
		t.Fatal(err)
	}
	for name, op := range operations(doc) {
		method, path, _ := strings.Cut(name, " ")
		if path == pickPath {
			continue // picker/gateway's TestHTTPPick holds its answers to the document
		}
		t.Run(name, func(t *testing.T) {
			var body io.Reader
			if rb, ok := op["requestBody"].(map[string]any); ok {
				media := rb["content"].(map[string]any)["application/json"].(map[string]any)
				ex := media["example"].(map[string]any)
				ex["model"] = testModel // the fixture's
				b, _ := json.Marshal(ex)
				body = bytes.NewReader(b)
				validate(t, c, media["schema"], b, "its request example")
			}
			req, _ := http.NewRequest(method, f.url+path, body)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer, ok := op["responses"].(map[string]any)[strconv.Itoa(resp.StatusCode)].(map[string]any)
			if !ok || resp.StatusCode != http.StatusOK {
				t.Fatalf("%s answered %d, want 200 (documented: %v): %s", name, resp.StatusCode, ok, got)
			}
			content := answer["content"].(map[string]any)
			media, ok := content[strings.Split(resp.Header.Get("Content-Type"), ";")[0]].(map[string]any)
			if !ok {
				t.Fatalf("%s answered Content-Type %q, documented %v", name, resp.Header.Get("Content-Type"), slices.Collect(maps.Keys(content)))
			}
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				validate(t, c, media["schema"], got, "its answer")
			}
			switch path {
			case "/":
				var idx struct{ OpenAPI string }
				json.Unmarshal(got, &idx)
				if idx.OpenAPI != openAPIPath {
					t.Errorf("GET / points to %q, want %s", idx.OpenAPI, openAPIPath)
				}
			case openAPIPath:
				if !bytes.Equal(got, openAPIDocument) {
					t.Error("GET /openapi.json is not the document")
				}
			}
		})
	}
}

// validate checks data against schema, a schema object or a $ref into
// the document.
func validate(t *testing.T, c *jsonschema.Compiler, schema any, data []byte, what string) {
	t.Helper()
	var loc string
	if ref, ok := schema.(map[string]any)["$ref"].(string); ok {
		loc = "openapi.json" + ref
	} else {
		loc = "inline/" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()+"/"+what) + ".json"
		if err := c.AddResource(loc, schema); err != nil {
			t.Fatal(err)
		}
	}
	sch, err := c.Compile(loc)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not JSON: %v: %s", what, err, data)
	}
	if err := sch.Validate(v); err != nil {
		t.Errorf("%s does not match %s: %v\n%s", what, loc, err, data)
	}
}

// Each documented object has the JSON fields of the Go type the handlers
// decode or write, by name, with compatible types; the enums are the
// values the code produces.
func TestOpenAPISchemasAreTheGoTypes(t *testing.T) {
	doc := openAPIDoc(t)
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	for name, typ := range map[string]reflect.Type{
		"LongestPrefixRequest":  reflect.TypeFor[longestPrefixRequestJSON](),
		"Prompt":                reflect.TypeFor[promptJSON](),
		"LongestPrefixResponse": reflect.TypeFor[client.LongestPrefixJSON](),
		"LookupResponse":        reflect.TypeFor[client.LookupJSON](),
		"PodsResponse":          reflect.TypeFor[client.PodsJSON](),
		"Decision":              reflect.TypeFor[picker.Decision](),
	} {
		matchType(t, schemas, name, schemas[name].(map[string]any), typ)
	}

	var health []string
	for v := range kvindexv1.EngineHealth_name {
		health = append(health, client.HealthName(kvindexv1.EngineHealth(v)))
	}
	var fallbacks []string
	for _, f := range picker.Fallbacks {
		fallbacks = append(fallbacks, string(f))
	}
	for _, tc := range []struct {
		schema, field string
		want          []string
	}{
		{"PodMatch", "health", health},
		{"PodInfo", "health", health},
		{"Decision", "fallback", fallbacks},
	} {
		var got []string
		for _, v := range schemas[tc.schema].(map[string]any)["properties"].(map[string]any)[tc.field].(map[string]any)["enum"].([]any) {
			got = append(got, v.(string))
		}
		slices.Sort(got)
		want := slices.Compact(slices.Sorted(slices.Values(tc.want)))
		if !slices.Equal(got, want) {
			t.Errorf("%s.%s: the document's enum %v, the code's values %v", tc.schema, tc.field, got, want)
		}
	}
}

// matchType compares a schema with a Go type: an object's properties are
// the struct's JSON fields (embedded structs flattened), arrays' items
// and maps' values recursively, scalars by JSON type. Types that decode
// themselves (UnmarshalJSON) or hold any JSON are not looked into.
func matchType(t *testing.T, schemas map[string]any, at string, schema map[string]any, typ reflect.Type) {
	t.Helper()
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		schema, at = schemas[name].(map[string]any), at+"("+name+")"
	}
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if reflect.PointerTo(typ).Implements(reflect.TypeFor[json.Unmarshaler]()) || typ.Kind() == reflect.Interface {
		return
	}
	types := map[string]bool{}
	switch st := schema["type"].(type) {
	case string:
		types[st] = true
	case []any:
		for _, s := range st {
			types[s.(string)] = true
		}
	}
	want := map[reflect.Kind]string{
		reflect.String: "string", reflect.Bool: "boolean", reflect.Float64: "number", reflect.Float32: "number",
		reflect.Int: "integer", reflect.Int64: "integer", reflect.Int32: "integer", reflect.Uint32: "integer", reflect.Uint64: "integer",
		reflect.Slice: "array", reflect.Struct: "object", reflect.Map: "object",
	}[typ.Kind()]
	if !types[want] {
		t.Errorf("%s: the document says %v, the Go type %s is a JSON %s", at, schema["type"], typ, want)
		return
	}
	switch typ.Kind() {
	case reflect.Slice:
		matchType(t, schemas, at+"[]", schema["items"].(map[string]any), typ.Elem())
	case reflect.Map:
		matchType(t, schemas, at+"{}", schema["additionalProperties"].(map[string]any), typ.Elem())
	case reflect.Struct:
		props, _ := schema["properties"].(map[string]any)
		fields := jsonFieldTypes(typ)
		if got, want := slices.Sorted(maps.Keys(props)), slices.Sorted(maps.Keys(fields)); !slices.Equal(got, want) {
			t.Errorf("%s: the document's properties\n%v\nthe Go type %s's JSON fields\n%v", at, got, typ, want)
			return
		}
		for name, f := range fields {
			matchType(t, schemas, at+"."+name, props[name].(map[string]any), f)
		}
	}
}

// jsonFieldTypes are a struct's JSON field names and types, embedded structs
// flattened, as encoding/json sees them.
func jsonFieldTypes(typ reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range typ.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case f.Anonymous && tag == "":
			maps.Copy(out, jsonFieldTypes(f.Type))
		case !f.IsExported():
		case tag != "":
			out[tag] = f.Type
		default:
			out[f.Name] = f.Type
		}
	}
	return out
}

// Package jsonids decodes a JSON array of non-negative integers (token
// ids, block hashes) straight into uint64s in one pass over the bytes.
// kvindex's HTTP API and the endpoint picker's request parser share it:
// both read 16k-id arrays on the request path, where encoding/json's
// reflection and its separate validation pass cost more than the rest
// of the request (BenchmarkIDList in api/server, BenchmarkPickerParse in
// picker/gateway).
//
// Parse accepts exactly the JSON arrays of integers that fit in 64 bits
// and refuses everything else, including JSON that is not valid (a
// leading zero, a trailing comma), so that a caller need not validate
// the array before; it reads null, fractions and exponents as errors
// where encoding/json would read null as 0.
package jsonids

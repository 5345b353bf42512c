//go:build race

package nginx

// raceEnabled lets TestNginxChat skip under the race detector (make test
// runs the package again without it).
const raceEnabled = true

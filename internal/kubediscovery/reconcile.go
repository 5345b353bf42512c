package kubediscovery

import (
	"maps"
	"slices"
)

// Reconciler turns each new set of engines (a Watcher's onChange) into
// the calls that make a consumer follow exactly that set: Remove for a
// name no longer wanted or whose value changed (an IP), then Add for each
// name not yet followed, in name order. Its zero value is not usable: see
// NewReconciler. Calls come from the goroutine that calls Update.
type Reconciler[T comparable] struct {
	want    func(Engine) (T, bool)
	add     func(name string, v T) error
	remove  func(name string)
	onError func(name string, err error)
	running map[string]T
}

// NewReconciler returns a Reconciler that follows each engine want
// accepts as the value it makes of it. An add that fails is reported to
// onError and tried again at the next Update.
func NewReconciler[T comparable](want func(Engine) (T, bool), add func(name string, v T) error,
	remove func(name string), onError func(name string, err error)) *Reconciler[T] {
	return &Reconciler[T]{want: want, add: add, remove: remove, onError: onError, running: map[string]T{}}
}

// Update follows engines: see Reconciler.
func (r *Reconciler[T]) Update(engines []Engine) {
	want := make(map[string]T, len(engines))
	for _, e := range engines {
		if v, ok := r.want(e); ok {
			want[e.Name] = v
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.running)) {
		if v, ok := want[name]; !ok || v != r.running[name] {
			r.remove(name)
			delete(r.running, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := r.running[name]; ok {
			continue
		}
		if err := r.add(name, want[name]); err != nil {
			r.onError(name, err)
			continue
		}
		r.running[name] = want[name]
	}
}

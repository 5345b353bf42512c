package watchhub

// Limits bound what watchers can make the hub hold: how many there are,
// how far each may fall behind, and the batches waiting for the fan-out.
// A zero field takes its default (DefaultLimits).
type Limits struct {
	// MaxWatchers caps open watchers (Open): Subscribe refuses more.
	MaxWatchers int
	// WatchQueueEvents and WatchQueueBytes bound each watcher's queue; a
	// watcher whose queue overflows is told so and closed.
	WatchQueueEvents int
	WatchQueueBytes  int64
	// HubQueueBatches and HubQueueBytes bound the batches waiting for the
	// fan-out; a batch that does not fit is dropped for every watcher
	// (and the watchers are told, see Hub).
	HubQueueBatches int
	HubQueueBytes   int64
}

// DefaultLimits are the Limits a zero field takes. They are the one home
// of these defaults: server.DefaultLimits holds them, and kvindex serve's
// flags take theirs from there.
var DefaultLimits = Limits{
	MaxWatchers:      64,
	WatchQueueEvents: 4096,
	WatchQueueBytes:  16 << 20,
	HubQueueBatches:  4096,
	HubQueueBytes:    64 << 20,
}

// WithDefaults returns l with every field that is not positive set to
// DefaultLimits' (none of the bounds can be "no limit").
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	if l.MaxWatchers <= 0 {
		l.MaxWatchers = d.MaxWatchers
	}
	if l.WatchQueueEvents <= 0 {
		l.WatchQueueEvents = d.WatchQueueEvents
	}
	if l.WatchQueueBytes <= 0 {
		l.WatchQueueBytes = d.WatchQueueBytes
	}
	if l.HubQueueBatches <= 0 {
		l.HubQueueBatches = d.HubQueueBatches
	}
	if l.HubQueueBytes <= 0 {
		l.HubQueueBytes = d.HubQueueBytes
	}
	return l
}

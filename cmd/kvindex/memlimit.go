package main

// streams is the most event streams serve's settings may open: every
// connect-mode engine rank and, in bind mode, up to --max-engines
// (memlimit.FromBudget spreads the event queues' share over them).
func (o *serveOptions) streams() int {
	n := 0
	for _, e := range o.engines {
		n += max(e.Ranks, 1)
	}
	if o.listen != "" {
		n += o.maxEngines
	}
	return n
}

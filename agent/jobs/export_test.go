package jobs

// Workers returns how many device workers the runner has (running or
// parked).
func (r *Runner) Workers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.workers)
}

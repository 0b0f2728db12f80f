package shadow

import "context"

// LastReported returns dev's reported state as this Store last wrote or
// read it, and reads etcd only when it knows none. Only the lock holder
// writes reported, so while this process holds the device the remembered
// state is the current one; call Forget(dev) when the device is acquired
// (another holder may have written since). A stale state costs no lost
// update: UpdateReported's transaction compares the version and merges
// again on a conflict.
func (s *Store) LastReported(ctx context.Context, dev string) (State, error) {
	if err := s.checkDevice(dev); err != nil {
		return State{}, err
	}
	if st, ok := s.known(dev); ok {
		return cloneState(st), nil
	}
	return s.GetReported(ctx, dev)
}

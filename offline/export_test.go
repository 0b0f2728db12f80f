package offline

// SetCompactBatch makes each Compact of ob delete at most n entries.
func SetCompactBatch(ob *Outbox, n int) { ob.batchForTest = n }

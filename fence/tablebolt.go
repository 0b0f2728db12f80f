package fence

import "go.etcd.io/bbolt"

// Bolt returns the table's database, for the gateway's other concerns
// that belong in the same file, each in a bucket of its own (the trust
// ledger of agent/bridge, auth.OpenLedger). Never touch the table's own
// buckets through it.
func (t *Table) Bolt() *bbolt.DB { return t.db }

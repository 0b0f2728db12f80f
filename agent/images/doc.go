// Package images is the gateway's content-addressed firmware image cache
// (issue 15): the job runner asks it for the image of a job by its SHA-256,
// size and URL (Ref) and reads chunks from it (Image.Chunk) to send as
// fw.chunk commands.
//
// Layout: entries live at DIR/sha256/<hex of the SHA-256>, nothing else
// lives there; a fetch streams into a temporary file DIR/.fetch-* while it
// checks the size (a source longer than the Ref's size is cut off at
// size+1 bytes read, a declared Content-Length other than the size is
// refused before reading) and the SHA-256, then fsyncs it, renames it under
// its name and fsyncs the directory. So an entry under its name is always
// complete and verified when it was written; a crash at any point leaves at
// most a temporary file, which Open removes. An entry found on disk is
// checked on its first use by this process (size and SHA-256; a corrupted
// one is removed, counted and fetched again) and its size on every use.
//
// Sources (Ref.URL): file:///absolute/path, http:// and https:// (through
// Options.HTTP, which carries the TLS configuration). HTTP 404 and 410 and a
// missing file are ErrNotFound; every other failure to read the source is
// ErrFetch with the cause wrapped.
//
// Concurrent Gets of one image share one fetch: the first runs it, the
// others wait for it (each within its own context; when the first caller
// gives up, a waiter takes the fetch over). The cache starts no goroutine.
//
// Space: Options.MaxBytes bounds the entries' total; beyond it the least
// recently used entries are removed, never one in use (an Image not yet
// closed) nor one being checked. Use is ordered by the entries' mtime,
// touched on every Get, so the order survives a restart.
//
// Stats are the cache's counters, for the agent's metrics:
//
//	Fetches       fetches from a source started (one per shared fetch)
//	FetchedBytes  bytes of the images fetched successfully
//	Hits          Gets answered from an entry on disk
//	Misses        Gets that waited for a fetch (their own or a shared one)
//	Failures      failed fetches and checks by reason: hash_mismatch,
//	              size_mismatch, too_large, not_found, fetch, bad_url,
//	              storage, canceled (each failure counted and logged once,
//	              with the URL and the hash, by the Get that ran it)
//	Corrupt       entries on disk that failed their check and were removed
//	Pruned        entries removed to stay within MaxBytes
//	Entries, Bytes, InUse   the entries now, their bytes, those open
package images

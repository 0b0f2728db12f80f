package images

import "encoding/hex"

// Joined is how many Gets wait for the fetch of sha in progress (0: none).
func (c *Cache) Joined(sha []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.busy[hex.EncodeToString(sha)]; o != nil {
		return o.joined
	}
	return 0
}

// CopyLimited is copyLimited, for the test that counts what it reads.
var CopyLimited = copyLimited

package auth

// Forge signs v as a root statement of content type ctype without the
// checks the issuing methods make: for tests of what a fence point refuses.
func (root *Root) Forge(ctype string, v any) ([]byte, error) { return root.sign(ctype, v) }

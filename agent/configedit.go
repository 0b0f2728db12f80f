package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// AuthBlock renders a as a config's top-level auth: section, the way
// `edgefence keys init` writes it: each file and key id set, strings
// double-quoted.
func AuthBlock(a AuthConfig) []byte {
	var b bytes.Buffer
	b.WriteString("auth:\n  # Written by `edgefence keys init`: this gateway's signing key and its certificate,\n" +
		"  # and the operator's root that fence points check them against.\n")
	for _, kv := range [...][2]string{{"key_file", a.KeyFile}, {"key_id", a.KeyID}, {"certificate", a.Certificate},
		{"revocations", a.Revocations}, {"trust_root", a.TrustRoot}, {"trust_root_kid", a.TrustRootKID}} {
		if kv[1] != "" {
			q, _ := json.Marshal(kv[1]) // a JSON string is a YAML double-quoted scalar
			fmt.Fprintf(&b, "  %s: %s\n", kv[0], q)
		}
	}
	return b.Bytes()
}

// WithAuth returns the config file src with its top-level auth: section
// replaced by AuthBlock(a), or with the block appended if it has none.
// Only the section's own lines change: every other byte of src is kept,
// comments and layout too. A file where that cannot be done safely — not
// one block mapping, an auth: section with anchors, aliases or multi-line
// scalars, or one whose lines it shares — is refused with ErrConfigEdit;
// and the result is checked: decoded, it must be src's config with a's
// auth: section and nothing else changed.
func WithAuth(src []byte, a AuthConfig) ([]byte, error) {
	block := AuthBlock(a)
	start, end, err := authLines(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfigEdit, err)
	}
	var out []byte
	if start == 0 {
		out = append(bytes.Clone(src), '\n')
		if len(src) > 0 && src[len(src)-1] != '\n' {
			out = append(out, '\n')
		}
		out = append(out, block...)
	} else {
		lines := bytes.SplitAfter(src, []byte("\n"))
		out = append(out, bytes.Join(lines[:start-1], nil)...)
		out = append(out, block...)
		out = append(out, bytes.Join(lines[end:], nil)...)
	}
	if err := sameButAuth(src, out, a); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfigEdit, err)
	}
	return out, nil
}

// authLines returns the first and last line (1-based) of src's top-level
// auth: section, or 0, 0 if it has none.
func authLines(src []byte) (start, end int, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return 0, 0, nil // empty, or only comments
	} else if err != nil {
		return 0, 0, err
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		return 0, 0, errors.New("more than one YAML document")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode || root.Style&yaml.FlowStyle != 0 || root.Column != 1 {
		return 0, 0, errors.New("not a block mapping of keys at the left margin")
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "auth" {
			continue
		}
		end, err := lastLine(v, k.Line)
		if err != nil {
			return 0, 0, fmt.Errorf("auth: %w", err)
		}
		if i+2 < len(root.Content) && root.Content[i+2].Line <= end {
			return 0, 0, errors.New("auth: shares a line with the next key")
		}
		return k.Line, end, nil
	}
	return 0, 0, nil
}

// lastLine returns the last line of n's subtree (at least from), refusing
// what a line-wise replacement could break.
func lastLine(n *yaml.Node, from int) (int, error) {
	if n.Anchor != "" || n.Kind == yaml.AliasNode {
		return 0, errors.New("anchors and aliases are not edited")
	}
	if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 || strings.Contains(n.Value, "\n") {
		return 0, errors.New("multi-line values are not edited")
	}
	last := max(from, n.Line)
	for _, c := range n.Content {
		l, err := lastLine(c, last)
		if err != nil {
			return 0, err
		}
		last = max(last, l)
	}
	return last, nil
}

// sameButAuth checks that after decodes to before with only its auth:
// section changed, to a.
func sameButAuth(before, after []byte, a AuthConfig) error {
	var b, c map[string]any
	if err := yaml.Unmarshal(before, &b); err != nil {
		return err
	}
	if err := yaml.Unmarshal(after, &c); err != nil {
		return fmt.Errorf("the edited file does not parse: %w", err)
	}
	delete(b, "auth")
	delete(c, "auth")
	if len(b) == 0 && len(c) == 0 || reflect.DeepEqual(b, c) {
		var got struct {
			Auth AuthConfig `yaml:"auth"`
		}
		if err := yaml.Unmarshal(after, &got); err == nil && got.Auth == a {
			return nil
		}
	}
	return errors.New("the edited file would not be the same config with the new auth: section")
}

// EditConfigAuth writes a's auth: section into the config file at path
// (WithAuth), atomically: a temporary file in the same directory, fsynced,
// with the file's mode, renamed over it (a symlink's target is edited).
// On ErrConfigEdit nothing is written.
func EditConfigAuth(path string, a AuthConfig) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(real)
	if err != nil {
		return err
	}
	out, err := WithAuth(src, a)
	if err != nil {
		return err
	}
	return replaceFile(real, out, fi.Mode().Perm())
}

// replaceFile replaces path with b: a new file beside it, fsynced, renamed
// over it, and the directory fsynced.
func replaceFile(path string, b []byte, mode os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(b); err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

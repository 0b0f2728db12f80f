package shadow

import (
	"strings"
	"time"
)

// FieldMeta says who last set a field, when, and under which token.
type FieldMeta struct {
	At time.Time `json:"at"`
	// By is the writer's id (StoreConfig.Writer): an operator, an
	// application, an agent.
	By string `json:"by,omitempty"`
	// Token is the fencing token the reported field was written under (the
	// CreateRevision of the writer's lock key); 0 for desired fields.
	Token int64 `json:"token,omitempty"`
}

// State is one side of a twin, desired or reported.
type State struct {
	// Fields is the JSON object itself.
	Fields map[string]any `json:"state"`
	// Meta holds per-field metadata keyed by JSON Pointer (RFC 6901,
	// "/a/b"): one entry per leaf field (a non-object value or an empty
	// object) that a patch has set.
	Meta map[string]FieldMeta `json:"meta,omitempty"`
	// Version is the etcd ModRevision of the side's key; 0 means never
	// written (or deleted). It is not stored in the value.
	Version int64 `json:"version"`
}

// Document is a device's twin as people read it.
type Document struct {
	Device   string `json:"device"`
	Desired  State  `json:"desired"`
	Reported State  `json:"reported"`
	// Delta is Delta(Desired.Fields, Reported.Fields): what the device
	// still has to do.
	Delta map[string]any `json:"delta"`
	// Version is the larger of the two sides' versions: it changes whenever
	// either side does.
	Version int64 `json:"version"`
	// Revision is the etcd store revision the document was read at; a
	// watch started at Revision+1 misses nothing after it.
	Revision int64 `json:"revision,omitempty"`
}

// NewDocument builds a document from its two sides and computes the delta.
func NewDocument(dev string, desired, reported State) *Document {
	return &Document{
		Device:   dev,
		Desired:  desired,
		Reported: reported,
		Delta:    Delta(desired.Fields, reported.Fields),
		Version:  max(desired.Version, reported.Version),
	}
}

// ApplyPatch returns st with patch merged in (see Merge) and the metadata
// of every field the patch sets replaced by m; metadata of fields that no
// longer exist (deleted by null, or replaced by an object) is dropped. The
// patch is checked with Normalize, and the merged state must fit lim too.
// st is not modified; Version is carried over.
func ApplyPatch(st State, patch map[string]any, m FieldMeta, lim Limits) (State, error) {
	lim = lim.withDefaults()
	p, err := Normalize(patch, lim)
	if err != nil {
		return State{}, err
	}
	fields := Clone(st.Fields)
	mergeInto(fields, p)
	if err := checkSize(fields, lim); err != nil {
		return State{}, err
	}
	meta := make(map[string]FieldMeta, len(st.Meta)+len(p))
	for k, v := range st.Meta {
		meta[k] = v
	}
	setMeta(meta, "", p, fields, m)
	for path := range meta {
		if !isLeaf(fields, path) {
			delete(meta, path)
		}
	}
	return State{Fields: fields, Meta: meta, Version: st.Version}, nil
}

// setMeta records m for every leaf the patch set in fields (the merged
// object at the same place): a non-object value, or an object the merge
// left empty.
func setMeta(meta map[string]FieldMeta, base string, patch, fields map[string]any, m FieldMeta) {
	for k, v := range patch {
		path := base + "/" + escapePointer(k)
		switch x := v.(type) {
		case nil:
		case map[string]any:
			sub, _ := fields[k].(map[string]any)
			if len(sub) == 0 {
				meta[path] = m
			} else {
				setMeta(meta, path, x, sub, m)
			}
		default:
			meta[path] = m
		}
	}
}

// isLeaf reports whether the JSON Pointer path names a field of fields
// that is not an object, or is an empty object.
func isLeaf(fields map[string]any, path string) bool {
	if !strings.HasPrefix(path, "/") {
		return false
	}
	cur := fields
	parts := strings.Split(path[1:], "/")
	for i, p := range parts {
		v, ok := cur[unescapePointer(p)]
		if !ok {
			return false
		}
		obj, isObj := v.(map[string]any)
		if i == len(parts)-1 {
			return !isObj || len(obj) == 0
		}
		if !isObj {
			return false
		}
		cur = obj
	}
	return false
}

var (
	pointerEscaper   = strings.NewReplacer("~", "~0", "/", "~1")
	pointerUnescaper = strings.NewReplacer("~1", "/", "~0", "~")
)

func escapePointer(s string) string   { return pointerEscaper.Replace(s) }
func unescapePointer(s string) string { return pointerUnescaper.Replace(s) }

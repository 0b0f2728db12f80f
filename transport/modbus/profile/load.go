package profile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Load reads and validates the profile in file. Every problem in it is
// reported, joined: each an *Error naming file, line and key, wrapping
// ErrProfile. A file that cannot be read is the os error, wrapped.
func Load(file string) (*Profile, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("modbus profile: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("modbus profile: %s: %w", file, err)
	}
	return Parse(b, file)
}

// Parse validates the profile in b; file names it in errors.
func Parse(b []byte, file string) (*Profile, error) {
	if len(b) > MaxFileSize {
		return nil, &Error{File: file, Msg: fmt.Sprintf("larger than %d bytes: not a profile", MaxFileSize)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		line := 0
		if m := yamlErrLineRE.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		return nil, &Error{File: file, Line: line, Msg: "yaml syntax: " + yamlMessage(err)}
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, &Error{File: file, Line: 1, Msg: "not a profile: want a mapping of keys (model:, fields:, …)"}
	}
	d := &decoder{file: file, lines: map[string]int{}, failed: map[string]bool{}, broken: map[string]bool{}}
	var raw rawProfile
	d.decode(doc.Content[0], reflect.ValueOf(&raw).Elem(), "")
	d.built = true
	p := d.build(&raw)
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].(*Error).Line < d.errs[j].(*Error).Line })
		return nil, errors.Join(d.errs...)
	}
	p.File = file
	return p, nil
}

var yamlErrLineRE = regexp.MustCompile(`line (\d+):`)

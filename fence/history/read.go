package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrCorrupt means a history line that is not a torn last line does not
// parse. Read wraps it with the file and line number.
var ErrCorrupt = errors.New("history: corrupt line")

// Read reads the JSON-lines history files at paths and returns their events,
// each file's in its own (decision) order, the files concatenated in the
// order given.
//
// Blank lines are skipped. A line that does not parse is skipped when it is
// a torn write: the file's last line, or a line followed by an OpOpened event
// (Create found it torn and sealed it off before appending). Any other
// unparseable line is an error wrapping ErrCorrupt that names file:line.
func Read(paths ...string) ([]Event, error) {
	var all []Event
	for _, p := range paths {
		evs, err := readFile(p)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	return all, nil
}

func readFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	return Decode(f, path)
}

// Decode reads one history's JSON lines from r by Read's rules (a torn last
// line is skipped); name is used in errors in place of the file name.
func Decode(rd io.Reader, name string) ([]Event, error) {
	path := name
	r := bufio.NewReaderSize(rd, 64<<10)
	var (
		evs     []Event
		bad     error // the previous non-blank line did not parse
		badLine int
	)
	for n := 1; ; n++ {
		line, rerr := r.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return nil, fmt.Errorf("history: %s:%d: %w", path, n, rerr)
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			var e Event
			if err := json.Unmarshal(line, &e); err != nil {
				if bad != nil {
					return nil, corrupt(path, badLine, bad)
				}
				bad, badLine = err, n
			} else {
				if bad != nil && e.Op != OpOpened {
					return nil, corrupt(path, badLine, bad)
				}
				bad = nil
				evs = append(evs, e)
			}
		}
		if rerr != nil { // io.EOF: a pending bad line was the last, torn
			return evs, nil
		}
	}
}

func corrupt(path string, line int, err error) error {
	return fmt.Errorf("%w: %s:%d: %w", ErrCorrupt, path, line, err)
}

package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// VerdictRecord is one line of the verdict log: one decision of a fence
// point, with the device's state after it. For an envelope that could not be
// decoded the command fields are empty; Device is then the addressed device
// (empty if that was not a valid id, and State is nil).
type VerdictRecord struct {
	Time     time.Time     `json:"time"`
	Device   string        `json:"device"`
	Token    fence.Token   `json:"token"`
	Seq      uint64        `json:"seq"`
	ID       string        `json:"id"`
	Kind     string        `json:"kind"`
	Holder   string        `json:"holder"`
	Verdict  fence.Verdict `json:"verdict"`
	MaxToken fence.Token   `json:"max_token"`
	LastSeq  uint64        `json:"last_seq"`
	Epoch    uint64        `json:"epoch,omitempty"` // the fence point's epoch for the device after the decision
	Reason   string        `json:"reason"`
	State    *State        `json:"state"`
}

// Mark is the fence point's mark after the decision.
func (r *VerdictRecord) Mark() fence.Mark { return fence.Mark{Token: r.MaxToken, Seq: r.LastSeq} }

// verdictLog writes records as JSON lines, each in a single Write so that a
// file opened with O_APPEND never interleaves partial lines.
type verdictLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *verdictLog) write(r *VerdictRecord) error {
	if l == nil || l.w == nil {
		return nil
	}
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("sim: verdict log: %w", err)
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(line); err != nil {
		return fmt.Errorf("sim: verdict log: %w", err)
	}
	return nil
}

// ReadVerdictLog parses a verdict log. Blank lines are skipped; a line that
// does not parse is an error naming its number. A final line cut short (a
// writer killed mid-Write) is an error too.
func ReadVerdictLog(r io.Reader) ([]VerdictRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var recs []VerdictRecord
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var rec VerdictRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return recs, fmt.Errorf("sim: verdict log line %d: %w", n, err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return recs, fmt.Errorf("sim: verdict log: %w", err)
	}
	return recs, nil
}

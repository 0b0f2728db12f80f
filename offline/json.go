package offline

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// The JSON forms of Record and Summary are what `edgefence outbox list
// --json` prints and what the agent's local API (GET /v1/outbox) serves:
// states and verdicts by name ("pending", "accepted", ...), times in RFC
// 3339, ages in whole milliseconds, a dropped body's SHA-256 in hex.

type recordJSON struct {
	Device   string     `json:"device"`
	ID       string     `json:"id"`
	Token    uint64     `json:"token"`
	Seq      uint64     `json:"seq"`
	Kind     string     `json:"kind"`
	Pos      uint64     `json:"pos"`
	State    string     `json:"state"`
	Created  time.Time  `json:"created"`
	Deadline time.Time  `json:"deadline"`
	AgeMS    int64      `json:"age_ms"`
	Resolved *time.Time `json:"resolved,omitempty"`
	Ack      *ackJSON   `json:"ack,omitempty"`
	// The body: its size, and for a terminal entry that no longer keeps
	// it, its SHA-256 in hex.
	BodyBytes   int    `json:"body_bytes,omitempty"`
	BodyDropped bool   `json:"body_dropped,omitempty"`
	BodySHA256  string `json:"body_sha256,omitempty"`
}

type ackJSON struct {
	Verdict  fence.Verdict `json:"verdict"`
	Token    uint64        `json:"token"`
	Seq      uint64        `json:"seq"`
	MaxToken uint64        `json:"max_token"`
	LastSeq  uint64        `json:"last_seq"`
	Reason   string        `json:"reason,omitempty"`
}

// MarshalJSON encodes the record for operators and scripts.
func (r Record) MarshalJSON() ([]byte, error) {
	j := recordJSON{Device: r.Device, ID: r.ID, Token: uint64(r.Token), Seq: r.Seq, Kind: r.Kind, Pos: r.Pos,
		State: r.StateString(), Created: r.Created.UTC(), Deadline: r.Deadline.UTC(), AgeMS: r.Age.Milliseconds(),
		BodyBytes: r.BodyBytes, BodyDropped: r.BodyDropped, BodySHA256: hex.EncodeToString(r.BodySHA256)}
	if !r.Resolved.IsZero() {
		t := r.Resolved.UTC()
		j.Resolved = &t
	}
	if a := r.Ack; a != nil {
		j.Ack = &ackJSON{Verdict: a.Verdict, Token: uint64(a.Token), Seq: a.Seq, MaxToken: uint64(a.MaxToken), LastSeq: a.LastSeq, Reason: a.Reason}
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote.
func (r *Record) UnmarshalJSON(b []byte) error {
	var j recordJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var state fence.Verdict
	if j.State != "pending" {
		if err := state.UnmarshalText([]byte(j.State)); err != nil {
			return fmt.Errorf("offline: record %s: %w", j.ID, err)
		}
	}
	*r = Record{Device: j.Device, ID: j.ID, Token: fence.Token(j.Token), Seq: j.Seq, Kind: j.Kind, Pos: j.Pos,
		Created: j.Created, Deadline: j.Deadline, Age: time.Duration(j.AgeMS) * time.Millisecond, State: state,
		BodyBytes: j.BodyBytes, BodyDropped: j.BodyDropped}
	if j.BodySHA256 != "" {
		sum, err := hex.DecodeString(j.BodySHA256)
		if err != nil {
			return fmt.Errorf("offline: record %s: body_sha256: %w", j.ID, err)
		}
		r.BodySHA256 = sum
	}
	if j.Resolved != nil {
		r.Resolved = *j.Resolved
	}
	if a := j.Ack; a != nil {
		r.Ack = &fence.Ack{V: fence.Version, Device: j.Device, ID: j.ID, Verdict: a.Verdict, Token: fence.Token(a.Token), Seq: a.Seq,
			MaxToken: fence.Token(a.MaxToken), LastSeq: a.LastSeq, Reason: a.Reason}
	}
	return nil
}

// MarshalJSON adds oldest_age_ms and leaves out a zero oldest.
func (d DeviceSummary) MarshalJSON() ([]byte, error) {
	type plain DeviceSummary // without the methods
	j := struct {
		plain
		Oldest      *time.Time `json:"oldest,omitempty"`
		OldestAgeMS int64      `json:"oldest_age_ms"`
	}{plain: plain(d), Oldest: utcOrNil(d.Oldest), OldestAgeMS: d.OldestAge.Milliseconds()}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote.
func (d *DeviceSummary) UnmarshalJSON(b []byte) error {
	type plain DeviceSummary
	var j struct {
		plain
		OldestAgeMS int64 `json:"oldest_age_ms"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*d = DeviceSummary(j.plain)
	d.OldestAge = time.Duration(j.OldestAgeMS) * time.Millisecond
	return nil
}

// MarshalJSON adds oldest_age_ms and leaves out a zero oldest.
func (s Summary) MarshalJSON() ([]byte, error) {
	type plain Summary
	j := struct {
		plain
		Oldest      *time.Time `json:"oldest,omitempty"`
		OldestAgeMS int64      `json:"oldest_age_ms"`
	}{plain: plain(s), Oldest: utcOrNil(s.Oldest), OldestAgeMS: s.OldestAge.Milliseconds()}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote.
func (s *Summary) UnmarshalJSON(b []byte) error {
	type plain Summary
	var j struct {
		plain
		OldestAgeMS int64 `json:"oldest_age_ms"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Summary(j.plain)
	s.OldestAge = time.Duration(j.OldestAgeMS) * time.Millisecond
	return nil
}

func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

package firmware

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// The epoch vectors: scenarios of commands and resets answered by a real
// devices/shim, one fresh device per scenario, each step at a fleet epoch
// (for signed commands, the shim's Keys hold it, as auth.Trust.Epoch; the
// C runner's port.epoch returns it). They prove "resets that close the
// past" in C: a command captured before a reset or a fleet epoch statement
// and replayed after it is stale whatever its token; one of an epoch the
// fence point has no statement of is invalid, its reason worded alike; a
// reset not above the device's epoch is a replay; the mark's epoch holds
// the device's epoch when the fleet's is lower.

// epochDev is the device every epoch step is addressed to.
const epochDev = "dev-e"

// fleetKeys is vectorKeys with a fleet epoch (what the shim reads from an
// auth.Trust): the step's.
type fleetKeys struct {
	vectorKeys
	epoch uint64
}

func (k *fleetKeys) Epoch() uint64 { return k.epoch }

// epochStep is one step: the fleet epoch, then a command or a reset.
type epochStep struct {
	fleet uint64
	in    []byte
}

type epochScenario struct {
	name   string
	signed bool
	steps  []epochStep
}

// epochCmd is a command to epochDev at epoch, token and seq: signed by
// gw-a, or plain.
func epochCmd(signed bool, epoch uint64, t fence.Token, seq uint64) []byte {
	env := mustEnvelope(fence.Envelope{Device: epochDev, Token: t, Seq: seq, ID: fmt.Sprintf("e%d-%d-%d", epoch, t, seq),
		Kind: "set", Holder: "gw-a", Epoch: epoch})
	if signed {
		return newCose("gw-a", env).bytes()
	}
	return env
}

// epochReset is the root's reset of epochDev to t/seq with counter, into
// epoch.
func epochReset(t, seq, counter, epoch uint64) []byte {
	return newReset("operator", resetPayload(epochDev, t, seq, counter, fmt.Sprintf("reset:e%d", counter), epoch)).bytes()
}

func epochScenarios() []epochScenario {
	plain := func(fleet uint64, in []byte) epochStep { return epochStep{fleet, in} }
	cmd := func(epoch uint64, t fence.Token, seq uint64) []byte { return epochCmd(false, epoch, t, seq) }
	captured := cmd(0, 9, 1)
	// Plain commands: the port's fleet epoch (5 at every step) does not
	// count (devices/shim without Keys has none): the device's epoch is
	// its last reset's.
	resets := []epochStep{plain(5, cmd(0, 5, 3)), plain(5, captured), plain(5, epochReset(2, 1, 1, 1)),
		plain(5, captured), plain(5, cmd(0, 3, 1)), plain(5, cmd(1, 3, 1)), plain(5, cmd(2, 4, 1)),
		plain(5, cmd(1, 9, 1)), plain(5, cmd(1, 9, 1)), plain(5, epochReset(1, 1, 2, 1)),
		plain(5, epochReset(1, 1, 1, 2)), plain(5, epochReset(1, 1, 2, 2)), plain(5, cmd(1, 9, 2)),
		plain(5, captured), plain(5, cmd(2, 1, 1)), plain(5, cmd(0, 1<<63, 1))}

	s := func(epoch uint64, t fence.Token, seq uint64) []byte { return epochCmd(true, epoch, t, seq) }
	sCaptured := s(0, 9, 1)
	fleet := []epochStep{{0, s(0, 5, 3)}, {0, sCaptured}, {2, sCaptured}, {2, s(1, 10, 1)}, {2, s(3, 1, 1)},
		{2, mustEnvelope(fence.Envelope{Device: epochDev, Token: 1 << 63, Seq: 1, ID: "forged", Kind: "set", Epoch: 2})},
		{2, s(2, 1, 1)}, {2, s(2, 1, 1)}, {3, s(2, 2, 1)}, {3, s(3, 1, 1)}, {3, epochReset(9, 9, 1, 3)},
		{3, epochReset(9, 9, 1, 4)}, {3, s(3, 9, 9)}, {3, s(4, 9, 10)}, {0, s(4, 9, 11)}, {0, sCaptured},
		{6, s(4, 9, 12)}, {6, epochReset(1, 1, 2, 6)}, {6, epochReset(1, 1, 2, 7)}, {6, s(7, 1, 2)}}
	// The mark's epoch holds when the trust holding the fleet's is lost
	// (a fence point keeping it in memory only, restarted).
	held := []epochStep{{2, s(2, 5, 1)}, {0, s(0, 9, 1)}, {0, s(2, 5, 2)}, {1, s(1, 9, 1)}}
	return []epochScenario{
		{name: "plain: a reset closes the past", steps: resets},
		{name: "signed: the fleet epoch closes the past, resets above it", signed: true, steps: fleet},
		{name: "signed: the mark's epoch without the fleet's", signed: true, steps: held},
	}
}

// epochVectors answers the scenarios with a real devices/shim: commands
// plain (Options.Root only: resets) or signed (Keys with the fleet epoch,
// and Root).
func (w *hdr) epochVectors(dir string) error {
	root := findKey("operator")
	rk, err := auth.NewRootKey([]byte(root.kid), &root.priv.PublicKey)
	if err != nil {
		return err
	}
	var rows []string
	for i, sc := range epochScenarios() {
		opts := &shim.Options{Root: rk}
		keys := &fleetKeys{}
		if sc.signed {
			opts.Keys = keys
		}
		s, err := shim.Open(filepath.Join(dir, fmt.Sprintf("epoch-%d.db", i)), opts)
		if err != nil {
			return err
		}
		var steps []string
		for k, st := range sc.steps {
			keys.epoch = st.fleet
			a := s.Handle(epochDev, st.in, nopDevice{})
			blankReason(&a)
			ack, err := fence.MarshalAck(&a)
			if err != nil {
				s.Close()
				return fmt.Errorf("epoch %s, step %d: %w", sc.name, k, err)
			}
			steps = append(steps, fmt.Sprintf("\t{%dull, %s, %d, %dull, %dull, %dull, %s},\n", st.fleet, w.blob(st.in),
				a.Verdict, a.Epoch, a.MaxToken, a.LastSeq, w.blob(ack)))
		}
		if err := s.Close(); err != nil {
			return err
		}
		name := fmt.Sprintf("efs_vepoch%d", i)
		fmt.Fprintf(&w.tables, "static const efs_vestep %s[] = {\n%s};\n\n", name, strings.Join(steps, ""))
		rows = append(rows, fmt.Sprintf("\t{%s, %d, %s, %d},\n", cstr(sc.name), b2i(sc.signed), name, len(steps)))
	}
	w.table("efs_vepoch", "efs_vepochs", rows)
	return nil
}

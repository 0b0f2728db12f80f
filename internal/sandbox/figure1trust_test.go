package sandbox

import (
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

// TestFigure1Signed: the demo's run. The sandbox provisions the trust
// itself (Figure1Config.Trust): both agents sign, the devices take only
// signed commands, and the timeline is Figure 1's; in its forgery scene a
// broker client with a gateway's publish rights but no signing key sends
// an unsigned envelope with token 2^63: refused invalid, the mark
// unchanged, B's next command accepted (CheckFenced checks it). The
// serial variant runs signed too, its device `auth: off` at both
// gateways (B's table knows only B's certificate).
func TestFigure1Signed(t *testing.T) {
	t.Run("mqtt", func(t *testing.T) {
		res := runFigure1(t, func(c *Figure1Config) { c.Trust, c.Forgery = trustKit(t), true })
		if err := res.CheckFenced(); err != nil {
			t.Fatal(err)
		}
		if f := res.Forgery; f == nil || f.Verdict != fence.Invalid || f.After != f.Before || f.After.Token != res.TokenB[f.Device] {
			t.Fatalf("forgery %+v, want refused invalid at B's mark (tokens %v)", f, res.TokenB)
		}
	})
	t.Run("serial", func(t *testing.T) {
		res := runFigure1(t, func(c *Figure1Config) { c.Serial, c.Devices, c.Trust = true, []string{"plc-1"}, trustKit(t) })
		if err := res.CheckFenced(); err != nil {
			t.Fatal(err)
		}
	})
}

func trustKit(t testing.TB) *TrustKit {
	t.Helper()
	k, err := NewTrustKit(filepath.Join(t.TempDir(), "trust"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

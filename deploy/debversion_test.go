package deploy_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A Debian version without an epoch or a revision: a leading digit, then
// only these characters (deb-version(7)).
var debUpstream = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)

// deploy/debversion.sh turns `git describe --tags --always --dirty` output
// into a Debian version that dpkg accepts and that sorts the way releases do.
func TestDebVersion(t *testing.T) {
	cases := []struct{ describe, want string }{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"v1.2.3-rc1", "1.2.3~rc1"},
		{"v1.2.3-4-gabc1234", "1.2.3+git4.gabc1234"},
		{"v1.2.3-4-gabc1234-dirty", "1.2.3+git4.gabc1234.dirty"},
		{"v1.2.3-rc.1-4-gabc1234", "1.2.3~rc.1+git4.gabc1234"},
		{"d18b12c", "0.0.0~gitd18b12c"}, // no tag yet
		{"d18b12c-dirty", "0.0.0~gitd18b12c.dirty"},
		{"1234567", "0.0.0~git1234567"}, // a hash that happens to be all digits
		{"dev", "0.0.0~dev"},            // no git
		{"", "0.0.0~dev"},
		{"feature/x_y", "0.0.0~feature.x.y"},
	}
	for _, c := range cases {
		out, err := exec.Command("sh", "debversion.sh", c.describe).CombinedOutput()
		got := strings.TrimSpace(string(out))
		if err != nil || got != c.want {
			t.Errorf("debversion.sh %q = %q, %v; want %q", c.describe, got, err, c.want)
		}
		if !debUpstream.MatchString(got) {
			t.Errorf("debversion.sh %q = %q: not a Debian version", c.describe, got)
		}
	}

	// dpkg's own ordering: pre-release < release < commits after it.
	tool(t, "dpkg", "apt-get install dpkg")
	order := []string{"0.0.0~dev", "0.0.0~gitd18b12c", "1.2.3~rc1", "1.2.3", "1.2.3+git4.gabc1234", "1.2.3+git4.gabc1234.dirty", "1.2.4~rc1"}
	for i := 1; i < len(order); i++ {
		if out, err := runErr(t, time.Minute, ".", nil, "dpkg", "--compare-versions", order[i-1], "lt", order[i]); err != nil {
			t.Errorf("dpkg: %s is not below %s: %v %s", order[i-1], order[i], err, out)
		}
	}
}

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// modbusConfig is goodConfig with a Modbus device on a bus, its profiles
// given by profiles (a YAML list).
func modbusConfig(profiles string) string {
	return override(goodConfig, `modbus:
  profiles: `+profiles+`
  buses:
    - {name: rs485, rtu: {port: /dev/ttyUSB1}}
devices:
  - {id: dev-1, auth: off}
  - id: meter-1
    fence: gateway
    home: gw-a
    modbus: {bus: rs485, unit: 7, profile: m1}
    auth: off`)
}

const goodProfile = "model: m1\nfields:\n  - {name: volts, table: input, address: 0, type: float32}\n"

// writeFiles writes name → content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// LoadConfig loads the profiles, from the config file's directory, and
// reports their problems with the profile's file, line and key.
func TestLoadConfigModbusProfiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"edgefence.yaml":   modbusConfig("[profiles/m1.yaml]"),
		"profiles/m1.yaml": goodProfile,
	})
	c, err := LoadConfig(filepath.Join(dir, "edgefence.yaml")) // the test's directory is not dir
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "profiles", "m1.yaml"); c.Modbus.Profiles[0] != want {
		t.Errorf("profile path %q, want %q", c.Modbus.Profiles[0], want)
	}
	ps, err := c.ModbusProfiles()
	if err != nil || ps["m1"] == nil || len(ps["m1"].PollBlocks()) != 1 {
		t.Fatalf("profiles %v %v", ps, err)
	}
	// Without profiles: none, and no error.
	if ps, err := (&Config{}).ModbusProfiles(); err != nil || len(ps) != 0 {
		t.Fatalf("no profiles: %v %v", ps, err)
	}

	cfg := filepath.Join(dir, "edgefence.yaml")
	prof := filepath.Join(dir, "profiles", "m1.yaml")
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string // the problems, in order
	}{
		{"a problem in a profile", map[string]string{
			"edgefence.yaml":   modbusConfig("[profiles/m1.yaml]"),
			"profiles/m1.yaml": "model: m1\nfields:\n  - name: volts\n    table: input\n    address: 0\n    type: float64\n",
		}, []string{prof + `:6: fields[0].type: "float64": want int16, uint16, int32, uint32, float32 or bool`}},
		{"config and profile problems, the config's first", map[string]string{
			"edgefence.yaml":   strings.Replace(modbusConfig("[profiles/m1.yaml]"), "unit: 7", "unit: 0", 1),
			"profiles/m1.yaml": "model: m1\nfields:\n  - {name: volts, table: input, address: 0, type: float32, writable: true}\n",
		}, []string{cfg + ":11: devices[1].modbus.unit: 0 is broadcast", prof + ":3: fields[0].writable: a input table is read-only"}},
		{"missing profile", map[string]string{
			"edgefence.yaml":   modbusConfig("[profiles/m1.yaml, profiles/none.yaml]"),
			"profiles/m1.yaml": goodProfile,
		}, []string{cfg + ":14: modbus.profiles[1]: " + filepath.Join(dir, "profiles", "none.yaml") + ": no such file or directory"}},
		{"model twice", map[string]string{
			"edgefence.yaml":   modbusConfig("\n    - profiles/m1.yaml\n    - profiles/m1-copy.yaml"),
			"profiles/m1.yaml": goodProfile, "profiles/m1-copy.yaml": goodProfile,
		}, []string{cfg + `:16: modbus.profiles[1]: model "m1" is also the model of ` + prof}},
		{"unknown model", map[string]string{
			"edgefence.yaml":   strings.Replace(modbusConfig("[profiles/m1.yaml]"), "profile: m1", "profile: m2", 1),
			"profiles/m1.yaml": goodProfile,
		}, []string{cfg + `:11: devices[1].modbus.profile: "m2": no profile of modbus.profiles has this model`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []string{"profiles/m1.yaml", "profiles/m1-copy.yaml"} {
				os.Remove(filepath.Join(dir, f))
			}
			writeFiles(t, dir, tc.files)
			_, err := LoadConfig(cfg)
			ces := ConfigErrors(err)
			if len(ces) != len(tc.want) {
				t.Fatalf("got\n%v\nwant\n%s", err, strings.Join(tc.want, "\n"))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(ces[i].Error(), w) {
					t.Errorf("problem %d:\n%v\nwant\n%s", i, ces[i], w)
				}
			}
		})
	}
}

// ParseConfig reads no files: a profile that is not there is not its
// problem (LoadConfig's and ModbusProfiles'), and relative paths stay.
func TestParseConfigLeavesProfilesAlone(t *testing.T) {
	c, err := ParseConfig([]byte(modbusConfig("[profiles/none.yaml]")))
	if err != nil || c.Modbus.Profiles[0] != "profiles/none.yaml" {
		t.Fatalf("%v %+v", err, c)
	}
	if _, err := c.ModbusProfiles(); err == nil || !strings.Contains(err.Error(), "modbus.profiles[0]: profiles/none.yaml: no such file") {
		t.Fatalf("ModbusProfiles: %v", err)
	}
}

package main

import (
	"flag"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/agent"
)

const configUsage = `usage: edgefence config <command> [flags]

commands:
  check [--json] FILE   validate FILE; print it with the defaults filled in

check exits 0 and prints the effective config (secrets shown as <redacted>,
or <from env NAME> / <from file PATH> when an environment override sets
them), or exits 1 and prints every problem on its own line as
FILE:LINE: KEY: MESSAGE. Usage errors exit 2.
`

func cmdConfig(args []string, stdout, stderr io.Writer) error {
	return subcommand("config", configUsage, map[string]command{"check": cmdConfigCheck}, args, stdout, stderr)
}

func cmdConfigCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the effective config as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: edgefence config check [--json] FILE

Validates FILE (and the environment overrides of its secrets: EDGEFENCE_MQTT_PASSWORD,
EDGEFENCE_ETCD_PASSWORD, their _FILE variants, $CREDENTIALS_DIRECTORY) and prints the
effective config with the defaults filled in, secrets redacted; or prints every problem,
one a line: FILE:LINE: KEY: MESSAGE. Exit 0 valid, 1 invalid, 2 usage.

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	c, err := agent.LoadConfig(fs.Arg(0))
	if err != nil {
		return err
	}
	if *asJSON {
		// Through YAML, so that JSON has the config file's keys and
		// durations as the file writes them ("10s").
		b, err := yaml.Marshal(c)
		if err != nil {
			return err
		}
		var v any
		if err := yaml.Unmarshal(b, &v); err != nil {
			return err
		}
		return printJSON(stdout, v)
	}
	enc := yaml.NewEncoder(stdout)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return err
	}
	return enc.Close()
}

package deploy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// copyrightLine is the copyright notice of the project, in the appendix of
// LICENSE and in the packages' copyright file.
const copyrightLine = "Copyright 2026 The edgefence Authors"

// TestLicense: the repository is under Apache-2.0 (LICENSE at the root, the
// standard text with its appendix filled in), and what the packages say
// agrees: deploy/copyright (installed as /usr/share/doc/<pkg>/copyright,
// which TestPackage compares byte for byte) and the license field of
// deploy/nfpm*.yaml.
func TestLicense(t *testing.T) {
	lic, err := os.ReadFile(filepath.Join(repoRoot, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Apache License\n                           Version 2.0, January 2004",
		"END OF TERMS AND CONDITIONS", "   " + copyrightLine + "\n",
		`Licensed under the Apache License, Version 2.0 (the "License");`} {
		if !bytes.Contains(lic, []byte(want)) {
			t.Errorf("LICENSE does not contain %q", want)
		}
	}
	if bytes.Contains(lic, []byte("[yyyy]")) {
		t.Error("LICENSE: the appendix's copyright line is still the template's [yyyy] [name of copyright owner]")
	}

	cp, err := os.ReadFile("copyright")
	if err != nil {
		t.Fatal(err)
	}
	// Machine-readable debian/copyright: the Files: * paragraph names the
	// license, and a stand-alone paragraph carries its text.
	paras := strings.Split(string(cp), "\n\n")
	if !strings.HasPrefix(paras[0], "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n") {
		t.Errorf("deploy/copyright: header paragraph %q, want the DEP-5 Format: line first", paras[0])
	}
	var files, text bool
	for _, p := range paras[1:] {
		switch {
		case strings.HasPrefix(p, "Files: *\n"):
			files = true
			if want := "Copyright: " + strings.TrimPrefix(copyrightLine, "Copyright ") + "\n"; !strings.Contains(p, want) {
				t.Errorf("deploy/copyright: Files: * paragraph has no %q:\n%s", want, p)
			}
			if !regexp.MustCompile(`(?m)^License: Apache-2.0$`).MatchString(p) {
				t.Errorf("deploy/copyright: Files: * paragraph is not License: Apache-2.0:\n%s", p)
			}
		case strings.HasPrefix(p, "License: Apache-2.0\n"):
			text = strings.Contains(p, "/usr/share/common-licenses/Apache-2.0")
		}
	}
	if !files || !text {
		t.Errorf("deploy/copyright: want a Files: * paragraph (%v) and a License: Apache-2.0 paragraph pointing at /usr/share/common-licenses/Apache-2.0 (%v)", files, text)
	}
	if bytes.Contains(bytes.ToLower(cp), []byte("unspecified")) {
		t.Error(`deploy/copyright still says "unspecified"`)
	}

	for _, cfg := range []string{"nfpm.yaml", "nfpm-devsim.yaml"} {
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := "(none)"
		if m := regexp.MustCompile(`(?m)^license: (.*)$`).FindSubmatch(b); m != nil {
			got = string(m[1])
		}
		if got != "Apache-2.0" {
			t.Errorf("deploy/%s: license field %s, want Apache-2.0", cfg, got)
		}
	}
}

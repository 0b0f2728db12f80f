package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/fence/auth"
)

// cmdKeysManifest signs an image manifest with the operator's root, or
// (--show) prints one and, given the root's public key, verifies it.
func cmdKeysManifest(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("manifest", stderr)
	rootKey := fs.String("root-key", "", "the operator's root private key: FILE (PREFIX.key, or PREFIX)")
	rootKid := fs.String("root-kid", "operator", "the operator key's id, as the fence points know it")
	image := fs.String("image", "", "the firmware image file")
	version := fs.Uint64("version", 0, "the image's security version (anti-rollback)")
	name := fs.String("name", "", "a name for people (at most 64 bytes)")
	var out string
	fs.StringVar(&out, "o", "", "manifest file to write")
	fs.StringVar(&out, "out", "", "manifest file to write")
	show := fs.String("show", "", "print the manifest FILE instead of signing one")
	var rootPub string
	fs.StringVar(&rootPub, "root-pub", "", "with --show: verify against the operator's public key (PEM)")
	deprecatedAlias(fs, "root", "root-pub", &rootPub)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *show != "" {
		return showManifest(*show, rootPub, *rootKid, *image, stdout)
	}
	versionSet := false
	fs.Visit(func(f *flag.Flag) { versionSet = versionSet || f.Name == "version" })
	if *rootKey == "" || *image == "" || !versionSet || out == "" {
		return keysUsageError(stderr, "keys manifest: --root-key, --image, --version and -o are required (or --show FILE)")
	}
	r, err := openRoot(*rootKey, *rootKid)
	if err != nil {
		return err
	}
	sum, size, err := images.HashFile(*image)
	if err != nil {
		return err
	}
	raw, err := r.Manifest(auth.Manifest{Image: sum, Size: size, Version: *version, Name: *name, Issued: time.Now().UnixMilli()})
	if err != nil {
		return fmt.Errorf("keys manifest: %w", err)
	}
	if err := os.WriteFile(out, raw, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s: sha256 %x, %d bytes, security version %d\nwrote %s (%d bytes, signed by %s)\n",
		*image, sum, size, *version, out, len(raw), *rootKid)
	return nil
}

// showManifest prints the manifest at path; with rootPub it verifies it as
// a device would, with image that the image file is the one it names.
func showManifest(path, rootPub, rootKid, image string, stdout io.Writer) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	m, err := auth.PeekManifest(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(stdout, "manifest %s\n  image    sha256 %x\n  size     %d bytes\n  version  %d (security version)\n",
		path, m.Image, m.Size, m.Version)
	if m.Name != "" {
		fmt.Fprintf(stdout, "  name     %s\n", m.Name)
	}
	fmt.Fprintf(stdout, "  issued   %s\n", time.UnixMilli(m.Issued).UTC().Format(time.RFC3339))
	var bad []string
	if rootPub == "" {
		fmt.Fprintln(stdout, "  signature not checked (give --root-pub FILE)")
	} else if err := verifyManifestFile(raw, rootPub, rootKid); err != nil {
		bad = append(bad, fmt.Sprintf("signature: %v", err))
	} else {
		fmt.Fprintf(stdout, "  signature ok: the operator root %s\n", rootKid)
	}
	if image != "" {
		sum, size, err := images.HashFile(image)
		switch {
		case err != nil:
			bad = append(bad, err.Error())
		case string(sum) != string(m.Image) || size != m.Size:
			bad = append(bad, fmt.Sprintf("image %s is sha256 %x, %d bytes: not the one the manifest names", image, sum, size))
		default:
			fmt.Fprintf(stdout, "  image %s matches\n", image)
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(stdout, "%s: REFUSED: %s\n", path, strings.Join(bad, "; "))
		return exitError{1}
	}
	return nil
}

func verifyManifestFile(raw []byte, rootPub, rootKid string) error {
	pub, err := auth.ReadPublic(rootPub)
	if err != nil {
		return err
	}
	k, err := auth.NewRootKey([]byte(rootKid), pub)
	if err != nil {
		return err
	}
	_, err = k.VerifyManifest(raw)
	return err
}

package fwjob

import "errors"

// Sentinel errors. Callers test them with errors.Is. A refused step's error
// becomes the reason of its Invalid ack.
var (
	// ErrCommand means a command is not a firmware step this device can
	// read: an unknown kind, a body that does not decode, a field missing
	// or out of bounds, another device's command.
	ErrCommand = errors.New("fwjob: bad command")
	// ErrState means the step is illegal in the job's current state; the
	// reason names the state ("state downloading").
	ErrState = errors.New("fwjob: illegal step")
	// ErrBusy means another job is in progress; the reason names it.
	ErrBusy = errors.New("fwjob: another job in progress")
	// ErrRollback means the image's security version is below the running
	// one (anti-rollback).
	ErrRollback = errors.New("fwjob: security version below the running one")
	// ErrManifest means fw.begin's image manifest is required
	// (Config.Manifests) and missing, does not verify against the
	// operator's root, or names another image, size or version; the reason
	// says which ("manifest: …").
	ErrManifest = errors.New("fwjob: image manifest refused")
	// ErrOffset means a chunk does not start at the bytes received; the
	// reason says where it must ("expected offset N").
	ErrOffset = errors.New("fwjob: chunk offset")
	// ErrNotBooted means the device's database has no boot record: Boot
	// must run before the device takes commands.
	ErrNotBooted = errors.New("fwjob: not booted")
	// ErrStorage means the job record or a slot file could not be read or
	// written; the step is refused and nothing moves.
	ErrStorage = errors.New("fwjob: storage")
)

package agent

import "reflect"

// A firmware device reports its state after every command, a download's
// chunks included: written to its twin (one etcd read and one fenced
// transaction), that is two etcd requests per chunk per device, and a
// device's disk and CPU shared with the gateway's writes. Download
// progress goes to the twin in steps of a tenth of the image instead
// (the execution's progress in etcd moves as often): a report that
// differs from the last one handed to the twin's writer only in the `fw`
// field's bytes and seq, within one download, is not written. Every
// change of job, state, slot, reason or token is, and so is any other
// field's; the device's retained MQTT report, which a new holder resumes
// from, is untouched.

// progressStep is the fraction of an image a download's reports must
// advance before one is written to the twin.
const progressStep = 10

// progressOnly reports whether report cur only moves a download's bytes
// less than a progressStep-th of the image past prev (the last report
// written).
func progressOnly(prev, cur map[string]any) bool {
	if prev == nil || len(prev) != len(cur) {
		return false
	}
	pf, ok1 := prev[FieldFirmware].(map[string]any)
	cf, ok2 := cur[FieldFirmware].(map[string]any)
	if !ok1 || !ok2 || len(pf) != len(cf) || cf["state"] != "downloading" {
		return false
	}
	for k, v := range cur {
		if k != FieldFirmware && !reflect.DeepEqual(prev[k], v) {
			return false
		}
	}
	for k, v := range cf {
		if k != "bytes" && k != "seq" && !reflect.DeepEqual(pf[k], v) {
			return false
		}
	}
	pb, ok1 := asUint(pf["bytes"])
	cb, ok2 := asUint(cf["bytes"])
	size, ok3 := asUint(cf["size"])
	return ok1 && ok2 && ok3 && cb >= pb && cb < size && cb-pb < size/progressStep
}

// asUint reads a CBOR-decoded unsigned number.
func asUint(v any) (uint64, bool) {
	switch n := v.(type) {
	case uint64:
		return n, true
	case int64:
		return uint64(n), n >= 0
	case int:
		return uint64(n), n >= 0
	}
	return 0, false
}

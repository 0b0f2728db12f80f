package history

import (
	"fmt"
	"strings"
	"text/tabwriter"
)

// maxPrinted bounds the violations String lists.
const maxPrinted = 100

// String prints the report as a small table for people: counts, then the
// violations (the first 100) or "OK".
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "events %d, devices %d, created %d, applied %d\n", r.Events, r.Devices, r.Created, r.Applied)
	fmt.Fprintf(&b, "fence verdicts:  %s", counts(r.FenceVerdicts))
	if r.Uncommitted > 0 {
		fmt.Fprintf(&b, " (and %d uncommitted accepts discarded)", r.Uncommitted)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "terminal states: %s\n", counts(r.Terminal))
	if fw := r.Firmware; len(fw.Accepted) > 0 {
		fmt.Fprintf(&b, "firmware steps:  %s (jobs at devices %d, activated %d)\n", counts(fw.Accepted), fw.Jobs, fw.Activated)
	}
	if r.OK() {
		b.WriteString("OK: no violations\n")
		return b.String()
	}
	fmt.Fprintf(&b, "VIOLATIONS: %d\n", len(r.Violations))
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INV\tDEVICE\tID\tDETAIL")
	for i, v := range r.Violations {
		if i == maxPrinted {
			fmt.Fprintf(tw, "...\t\t\t%d more\n", len(r.Violations)-maxPrinted)
			break
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Invariant, v.Device, v.ID, v.Detail)
	}
	tw.Flush()
	return b.String()
}

// counts prints a verdict count map sorted by verdict, "-" when empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		name := k
		if name == "" {
			name = `""`
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, m[k]))
	}
	return strings.Join(parts, " ")
}

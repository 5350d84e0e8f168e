package bench

import (
	"os"
	"strconv"
	"strings"
)

// cpuTimes reads the machine's CPU time counters from /proc/stat (Linux):
// the total and the steal, time the hypervisor gave to other guests while
// this one wanted to run. ok is false where there is no /proc/stat.
func cpuTimes() (total, steal int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i < 8 { // user … steal; guest time is counted in user already
			total += n
		}
		if i == 7 {
			steal = n
		}
	}
	return total, steal, true
}

// stealMeter measures the share of CPU time stolen by the host over a
// section: figures taken while it is high say more about the host than
// about the code.
type stealMeter struct {
	total, steal int64
	ok           bool
}

func startSteal() stealMeter {
	t, s, ok := cpuTimes()
	return stealMeter{t, s, ok}
}

// percent is the steal since start, in percent of all CPU time, and
// whether it could be read.
func (m stealMeter) percent() (float64, bool) {
	t, s, ok := cpuTimes()
	if !ok || !m.ok || t <= m.total {
		return 0, false
	}
	return 100 * float64(s-m.steal) / float64(t-m.total), true
}

// Package bench measures the library against baselines measured in the same
// run, on a real PostgreSQL: relay throughput against River's InsertManyTx and
// a bare claim/insert/stamp loop, Record's overhead on a host transaction,
// commit-to-fanned and write-receipt latency, and the relay's heap while it
// drains a large backlog. cmd/eventsbench runs it and prints the table.
package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/pgtest"
)

// Options sizes a run. Zero fields take the full-size defaults.
type Options struct {
	// AdminURL is a database on a server where the run may create databases.
	AdminURL string
	// Events is the backlog drained by the throughput runs. Default 50,000.
	Events int
	// MemoryEvents is the backlog drained while the heap is watched. Default 200,000.
	MemoryEvents int
	// Batch is the relay's batch size. Default 200.
	Batch int
	// HostTxs is how many host transactions the Record-overhead runs time.
	// Default 4,000.
	HostTxs int
	// LatencyFor is how long each steady-rate latency run lasts. Default 5s.
	LatencyFor time.Duration
	// Rates are the steady rates of the latency runs. Default 200 and 2,000/s.
	Rates []int
	// Receipts is how many record→commit→await loops each receipt run makes
	// in all. Default 1,000.
	Receipts int
	// Deliveries is how many webhook deliveries each webhooks run makes.
	// Default 3,000.
	Deliveries int
	// RetentionRows is the size of the table the operations section prunes.
	// Default 1,000,000.
	RetentionRows int
	// RetentionWindow is how long the operations section takes receipts
	// after each retention run, and at least while it runs. Default 5s.
	RetentionWindow time.Duration
	// WriteFor is how long each run of the write-path section lasts.
	// Default 5s.
	WriteFor time.Duration
	// OrderedEvents is the backlog of each run of the ordered section.
	// Default 20,000.
	OrderedEvents int
	// BacklogPairs is the larger owed backlog of the backlog section (the
	// smaller is a quarter of it). Default 40,000.
	BacklogPairs int
	// SnapshotFor is how long each run of the held-snapshot section writes
	// (the snapshot is held for the last four fifths). Default 5 minutes.
	SnapshotFor time.Duration
	// SnapshotRate is the held-snapshot section's steady write rate.
	// Default 1,000/s.
	SnapshotRate int
	// SnapshotBacklog is the backlog each held-snapshot run drains at its
	// end. Default 20,000.
	SnapshotBacklog int
	// SnapshotWriter makes the held-snapshot section's held transaction
	// write too (a transaction ID of its own, as a BEGIN left open after an
	// UPDATE has): the oldest running transaction for as long as it is held.
	SnapshotWriter bool
	// Only, when set, limits the run to the named sections
	// ("throughput", "writepath", "operations", "webhooks", "record",
	// "latency", "receipts", "memory", "ordered", "backlog", "snapshot").
	Only map[string]bool
	// Log receives progress lines.
	Log io.Writer
}

// outbox is the zero Outbox: the benchmark's tables on the search_path.
var outbox events.Outbox

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Events, 50_000)
	def(&o.MemoryEvents, 200_000)
	def(&o.Batch, 200)
	def(&o.HostTxs, 4_000)
	def(&o.Receipts, 1_000)
	def(&o.RetentionRows, 1_000_000)
	def(&o.Deliveries, 3_000)
	def(&o.OrderedEvents, 20_000)
	def(&o.BacklogPairs, 40_000)
	def(&o.SnapshotRate, 1_000)
	def(&o.SnapshotBacklog, 20_000)
	if o.SnapshotFor == 0 {
		o.SnapshotFor = 5 * time.Minute
	}
	if o.RetentionWindow == 0 {
		o.RetentionWindow = 5 * time.Second
	}
	if o.LatencyFor == 0 {
		o.LatencyFor = 5 * time.Second
	}
	if o.WriteFor == 0 {
		o.WriteFor = 4 * time.Second
	}
	if len(o.Rates) == 0 {
		o.Rates = []int{200, 2000}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// Result is one measured figure.
type Result struct {
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	// Target, when set, is the goal this figure is held to, and Met says
	// whether it was reached.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
}

// Report is a whole run.
type Report struct {
	Date      time.Time `json:"date"`
	GoVersion string    `json:"go_version"`
	CPUs      int       `json:"cpus"`
	Postgres  string    `json:"postgres"`
	Options   Options   `json:"-"`
	Results   []Result  `json:"results"`
	// Lost counts events that a run recorded but did not see fanned out
	// exactly as expected; anything but zero is a bug.
	Lost int `json:"lost"`
}

func (r *Report) add(section, name string, value float64, unit string) {
	r.Results = append(r.Results, Result{Section: section, Name: name, Value: value, Unit: unit})
}

func (r *Report) addTarget(section, name string, value float64, unit, target string, met bool) {
	r.Results = append(r.Results, Result{Section: section, Name: name, Value: value, Unit: unit, Target: target, Met: &met})
}

// Run runs the selected sections.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.defaults()
	h, err := newHarness(ctx, opts.AdminURL)
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep := &Report{Date: time.Now().UTC(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Options: opts}
	if err := h.admin.QueryRow(ctx, "SHOW server_version").Scan(&rep.Postgres); err != nil {
		return nil, err
	}
	want := func(s string) bool { return len(opts.Only) == 0 || opts.Only[s] }
	sections := []struct {
		name string
		run  func(context.Context, *harness, Options, *Report) error
	}{
		{"throughput", runThroughput},
		{"writepath", runWritePath},
		{"operations", runOperations},
		{"webhooks", runWebhooks},
		{"record", runRecordOverhead},
		{"latency", runLatency},
		{"receipts", runReceipts},
		{"memory", runMemory},
		{"ordered", runOrdered},
		{"backlog", runBacklog},
		{"snapshot", runSnapshot},
	}
	for _, s := range sections {
		if !want(s.name) {
			continue
		}
		fmt.Fprintf(opts.Log, "== %s\n", s.name)
		steal := startSteal()
		if err := s.run(ctx, h, opts, rep); err != nil {
			return rep, fmt.Errorf("%s: %w", s.name, err)
		}
		if pct, ok := steal.percent(); ok {
			// Figures taken while the host takes the CPU away move by more
			// than the ±15 % two shared cores explain.
			rep.add(s.name, "host CPU steal during the section", pct, "%")
			fmt.Fprintf(opts.Log, "host CPU steal during %s: %.1f %%\n", s.name, pct)
		}
	}
	return rep, nil
}

// harness creates a fresh migrated database for each measurement.
type harness struct {
	adminURL string
	admin    *pgxpool.Pool
	template string
	made     []string
	n        int
}

func newHarness(ctx context.Context, adminURL string) (*harness, error) {
	admin, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	h := &harness{adminURL: adminURL, admin: admin, template: fmt.Sprintf("eventsbench_tmpl_%d", time.Now().UnixNano()%1e9)}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+h.template); err != nil {
		admin.Close()
		return nil, err
	}
	h.made = append(h.made, h.template)
	pool, err := pgxpool.New(ctx, pgtest.WithDatabase(adminURL, h.template))
	if err != nil {
		h.close()
		return nil, err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		h.close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO bench_accounts SELECT g, 0 FROM generate_series(1, 1000) g;
		CREATE TABLE bench_watched (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO bench_watched SELECT g, 0 FROM generate_series(1, 1000) g;
		CREATE TABLE bench_watched_generic (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO bench_watched_generic SELECT g, 0 FROM generate_series(1, 1000) g;
		-- The same watch on the generic trigger function, as releases before
		-- the watches' own functions installed it.
		CREATE TRIGGER outbox_watch_events_update AFTER UPDATE ON bench_watched_generic FOR EACH ROW
		  WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION outbox_watch('account.changed', 'account:', 'id', 'none', '', '')`); err != nil {
		h.close()
		return nil, err
	}
	if err := outbox.InstallWatch(ctx, pool, events.Watch{Table: "bench_watched",
		Types: map[events.Op]string{events.OpUpdate: "account.changed"}, SubjectPrefix: "account:"}); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// database returns a pool to a new database cloned from the template.
// Closing the pool drops the database, so that no earlier measurement's
// tables (and their autovacuum) weigh on the next one.
func (h *harness) database(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	h.n++
	name := fmt.Sprintf("%s_%d", h.template, h.n)
	if _, err := h.admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+h.template); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(pgtest.WithDatabase(h.adminURL, name))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	h.made = append(h.made, name)
	return pool, nil
}

// drop removes the databases made so far, but the template.
func (h *harness) drop(ctx context.Context) {
	for _, name := range h.made[1:] {
		_, _ = h.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
	h.made = h.made[:1]
}

func (h *harness) close() {
	ctx := context.Background()
	for i := len(h.made) - 1; i >= 0; i-- {
		_, _ = h.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+h.made[i]+" WITH (FORCE)")
	}
	h.admin.Close()
}

// percentiles returns p50, p95 and p99 of ds.
func percentiles(ds []time.Duration) (p50, p95, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	at := func(p float64) time.Duration {
		i := int(p*float64(len(sorted))+0.5) - 1
		return sorted[max(0, min(i, len(sorted)-1))]
	}
	return at(0.50), at(0.95), at(0.99)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// SmokeOptions are tiny sizes that exercise every section in seconds.
func SmokeOptions(adminURL string) Options {
	return Options{
		AdminURL: adminURL, Events: 600, MemoryEvents: 1_000, Batch: 50, HostTxs: 40,
		LatencyFor: 300 * time.Millisecond, Rates: []int{50}, Receipts: 20, WriteFor: 300 * time.Millisecond,
		RetentionRows: 2_000, RetentionWindow: 300 * time.Millisecond, Deliveries: 100, OrderedEvents: 600, BacklogPairs: 400,
		SnapshotFor: 2 * time.Second, SnapshotRate: 100, SnapshotBacklog: 400,
	}
}

// writeRounds is how many rotated runs of each write-path variant to take.
func (o Options) writeRounds() int {
	if o.WriteFor < time.Second {
		return 1
	}
	return 5
}

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPgBouncer is returned by StartPgBouncer when the pgbouncer binary is
// missing.
var ErrNoPgBouncer = errors.New("pgtest: no pgbouncer binary on PATH or in /usr/sbin; install it (Debian: apt-get install pgbouncer)")

// PgBouncer is a throwaway PgBouncer in transaction pooling mode in front of
// a PostgreSQL server, on a free loopback port.
type PgBouncer struct {
	dir    string
	port   int
	cmd    *exec.Cmd
	exited <-chan struct{}
}

// StartPgBouncer starts PgBouncer in transaction pooling mode in front of the
// server that serverURL points at (any database name is passed through),
// trusting the user of serverURL. As root it runs as the postgres user,
// since PgBouncer refuses root.
func StartPgBouncer(ctx context.Context, serverURL string) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			return nil, ErrNoPgBouncer
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	dir, err := os.MkdirTemp("", "standmeet-events-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &PgBouncer{dir: dir}
	cred, err := b.configure(u)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if b.exited, err = startServer(b.cmd, cred); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	err = awaitConnections(ctx, b.URL(serverURL), b.exited, 30*time.Second)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, errExited):
		log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pgbouncer exited at start-up: %s", strings.TrimSpace(string(log)))
	}
	b.Close()
	return nil, fmt.Errorf("pgtest: pgbouncer did not accept connections within 30s: %w", err)
}

// configure picks b's port and writes its configuration, in transaction
// pooling mode in front of the server of u, trusting u's user. It returns
// the credential to run it with (as root: the postgres user's, who then owns
// b's directory).
func (b *PgBouncer) configure(u *url.URL) (*syscall.Credential, error) {
	var err error
	if b.port, err = freePort(); err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile =
`, u.Hostname(), u.Port(), b.port, filepath.Join(b.dir, "users.txt"), filepath.Join(b.dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(b.dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, "users.txt"), []byte(strconv.Quote(u.User.Username())+` ""`+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cred, err := serverCredential("PgBouncer")
	if err != nil {
		return nil, err
	}
	return cred, chown(cred, b.dir)
}

// URL returns serverURL with its host and port replaced by PgBouncer's.
func (b *PgBouncer) URL(serverURL string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		return serverURL
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", b.port)
	return u.String()
}

// Close stops PgBouncer and removes its files.
func (b *PgBouncer) Close() {
	if b.cmd != nil && b.cmd.Process != nil {
		stopServer(b.cmd, b.exited, syscall.SIGTERM, 5*time.Second)
	}
	os.RemoveAll(b.dir)
}

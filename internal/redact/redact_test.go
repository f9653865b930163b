package redact_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		// Well-formed URLs keep their shape.
		"amqp://guest:s3cret@host:5672/":              "amqp://guest:xxxxx@host:5672/",
		"postgres://postgres@host/db":                 "postgres://postgres@host/db",
		"postgres://u:p%40ss@h:5432/db?sslmode=off":   "postgres://u:xxxxx@h:5432/db?sslmode=off",
		"postgres://u@h/db?sslmode=off&password=s3cr": "postgres://u@h/db?sslmode=off&password=xxxxx",
		"amqp://[::1]:5672/vhost":                     "amqp://[::1]:5672/vhost",
		"":                                            "",
		// The shapes url.Parse reads as a path or an opaque part.
		"amqp//guest:S3CR3T@host":     "amqp//guest:xxxxx@host",
		"amqp:/guest:S3CR3T@host":     "amqp:/guest:xxxxx@host",
		"guest:S3CR3T@host:5672":      "guest:xxxxx@host:5672",
		"amqp:guest:S3CR3T@host":      "amqp:xxxxx@host",
		"postgres//u:S3CR3T@h:5432/d": "postgres//u:xxxxx@h:5432/d",
		// A password with an unencoded '#', '/' or '@'.
		"amqp://guest:12#S3CR3T@host/": "amqp://guest:xxxxx@host/",
		"amqp://guest:a/S3CR3T@host/":  "amqp://guest:xxxxx@host/",
		"amqp://guest:a@S3CR3T@host/":  "amqp://guest:xxxxx@host/",
		// No host: the text after the ':' is not a port.
		"amqp://guest:S3CR3T": "amqp://guest:xxxxx",
		"amqp//host:5672/vh":  "amqp//host:5672/vh",
		// Control characters are escaped, not printed.
		"postgres://u:p@host:port\x7f/db": `postgres://u:xxxxx@host:port\x7f/db`,
		// key=value strings.
		"host=h user=po password='po secret' dbname=d": "host=h user=po password=xxxxx dbname=d",
		"host=h password=s3cret":                       "host=h password=xxxxx",
		`password = 'it\'s secret' port=5432`:          "password = xxxxx port=5432",
		"host=h password='po secret":                   "host=h password=xxxxx",
		`host=h password='it\'s a \\ secret' user=it`:  "host=h password=xxxxx user=it",
		`password='a\\' b`:                             "password=xxxxx b",
		"sslpassword='two words' password='po secret'": "sslpassword=xxxxx password=xxxxx",
	} {
		require.Equal(t, want, redact.URL(raw), "%q", raw)
	}
}

func TestMessage(t *testing.T) {
	t.Parallel()
	require.Equal(t, "dial xxxxx failed, xxxxx", redact.Message("dial s3cret/x failed, s3cret%2Fx", "postgres://u:s3cret%2Fx@h/db"))
	require.Equal(t, "auth xxxxx", redact.Message("auth hunter2", "host=h user=u password='hunter2'"))
	require.Equal(t, "no password here", redact.Message("no password here", "postgres://u@h/db"))
	require.NotContains(t, redact.Message("bad s3cret", "postgres://u:s3cret@h:x\x7f"), "s3cret")
	require.Equal(t, "(message withheld: it may hold the unparsable connection string)", redact.Message("bad", "postgres://h\x7f/db"))

	// A quoted value is masked whole, and its words elsewhere are left alone.
	require.Equal(t, "user po on port 5432: password xxxxx refused (xxxxx)",
		redact.Message("user po on port 5432: password po secret refused ('po secret')", "host=h user=po password='po secret'"))
	// ... and so is the quoted value's first word with its opening quote, which a password
	// parameter of a URL's query would end at the space.
	require.Equal(t, "role 'po is not xxxxx",
		redact.Message("role 'po is not 'po secret'", "host=h user=po password='po secret'"))
	// Escaped quotes and backslashes: the value as written and as libpq reads it are masked;
	// its words, and its first word with the opening quote, are not.
	require.Equal(t, `user it: 'it\'s it's xxxxx / xxxxx / xxxxx`,
		redact.Message(`user it: 'it\'s it's 'it\'s a \\ secret' / it's a \ secret / it\'s a \\ secret`,
			`host=h password='it\'s a \\ secret' user=it`))
	// pgx shows an unterminated quote's first word masked and the rest as it was.
	require.Equal(t, "cannot parse `host=h password=xxxxx xxxxx`",
		redact.Message("cannot parse `host=h password=xxxxx S3CR3T`", "host=h password='po S3CR3T"))

	for _, raw := range []string{"amqp//guest:S3CR3T@host", "amqp:/guest:S3CR3T@host", "guest:S3CR3T@host:5672"} {
		msg := redact.Message("dial "+raw+": password S3CR3T refused", raw)
		require.NotContains(t, msg, "S3CR3T", raw)
		require.Contains(t, msg, "guest:xxxxx@host", raw)
	}
}

func TestArgs(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"-db", "postgres://u:xxxxx@h/db", "url=amqp://g:xxxxx@h/", "plain"},
		redact.Args([]string{"-db", "postgres://u:pw@h/db", "url=amqp://g:pw@h/", "plain"}))
	require.Equal(t, []string{"--amqp", "amqp//guest:xxxxx@host", "--amqp=amqp:/guest:xxxxx@host", "guest:xxxxx@host:5672",
		"--db=host=h password=xxxxx", "password=xxxxx", "ann@example.com"},
		redact.Args([]string{"--amqp", "amqp//guest:S3CR3T@host", "--amqp=amqp:/guest:S3CR3T@host", "guest:S3CR3T@host:5672",
			"--db=host=h password='S3 CR3T'", "password=S3CR3T", "ann@example.com"}))
}

// Cores of a planted password: distinctive text that must never appear in what the redactor
// returns, whatever the fuzzer puts around and between them.
var cores = []string{"Pw1kQ", "Pw2kQ", "Pw3kQ"}

// urlShape builds a connection string with password in one of the shapes users type.
func urlShape(shape uint8, scheme, user, password, host, rest string) string {
	schemes := []string{"amqp", "postgres", "postgresql", "amqps", ""}
	seps := []string{"://", ":/", "//", ":", "", ":///", "/"}
	s := schemes[int(shape)%len(schemes)]
	if scheme != "" && shape&0x80 != 0 {
		s = scheme
	}
	sep := seps[int(shape/8)%len(seps)]
	userinfo := user + ":" + password
	if shape&0x40 != 0 {
		userinfo = url.UserPassword(user, password).String() // percent-encoded, as url.URL.String writes it
	}
	return s + sep + userinfo + "@" + host + rest
}

// dsnShape builds a key=value string with password, quoted as libpq wants.
func dsnShape(user, password, host string) string {
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(password) + "'"
	return "host=" + strings.Fields(host + " h")[0] + " user=u" + " password=" + quoted + " dbname=d"
}

// FuzzURL plants a password in random URL shapes (well-formed or not, percent-encoded or not,
// with any text around it, delimiters included) and in key=value strings, and checks that
// neither URL nor Message, given a message that echoes the string, the password and its
// percent-encoded form, ever returns a piece of it.
func FuzzURL(f *testing.F) {
	f.Add(uint8(0), "", "guest", "", "", "host:5672", "/vhost")
	f.Add(uint8(9), "", "guest", "", "", "host", "")
	f.Add(uint8(16), "", "guest", "", "", "host", "")
	f.Add(uint8(20), "", "guest", "", "", "host:5672", "")
	f.Add(uint8(1), "", "u", "12#", "/x", "h", "/db?sslmode=off")
	f.Add(uint8(0x41), "", "u", "a@", "b c", "h", "/db")
	f.Add(uint8(2), "x", "", "'", `\`, "h@i", "/p@q")
	f.Add(uint8(0), "", "u", " secret", "", "h", "")
	f.Add(uint8(0), "", "u", `'s \`, ` '\'`, "h", "")
	f.Fuzz(func(t *testing.T, shape uint8, scheme, user, a, b, host, rest string) {
		if strings.Contains(scheme+user, "=") {
			t.Skip("an '=' before the password makes a key=value string, which dsnShape covers")
		}
		password := cores[0] + a + cores[1] + b + cores[2]
		for _, raw := range []string{urlShape(shape, scheme, user, password, host, rest), dsnShape(user, password, host)} {
			for _, core := range cores {
				if strings.Count(raw, core) > 1 || strings.Contains(raw, url.QueryEscape(core)+core) {
					t.Skip("the fuzzer put a core elsewhere too")
				}
			}
			if dsn := dsnShape(user, password, host); raw == dsn && !strings.Contains(dsn, "://") && !strings.ContainsAny(host, "@=") {
				// The first word of the password, with the quote before it, is not the password:
				// a message may show it elsewhere.
				decoy := "role '" + cores[0] + " unknown"
				require.Equal(t, decoy, redact.Message(decoy, dsn), "%q", dsn)
			}
			msg := "dial " + raw + ": password " + password + " (" + url.QueryEscape(password) + ") refused"
			for what, out := range map[string]string{"URL": redact.URL(raw), "Message": redact.Message(msg, raw), "Args": strings.Join(redact.Args([]string{"--db", raw, "--db=" + raw}), " ")} {
				for _, core := range cores {
					require.NotContains(t, out, core, "%s(%q) = %q", what, raw, out)
				}
			}
		}
	})
}
